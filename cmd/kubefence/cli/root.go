// Package cli holds kubefence's cobra commands. Commands are thin: each has an Options struct with
// Complete/Validate/Run (the command interface), writes to injected streams, prints its result
// through one printer (-o json or the human form), and returns errors; only main exits. The
// logic lives in the library packages (proxy, migrator/...).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubefence/kubefence/internal/logging"
)

// Exit codes of the kubefence binary (documented in docs/cli.md).
const (
	// ExitOK: the command did what it was asked.
	ExitOK = 0
	// ExitFailure: the command ran and failed (a backend refused, a timeout expired, a check found
	// a mismatch). What was left in place is said on stderr.
	ExitFailure = 1
	// ExitUsage: the command line or an input file is invalid; nothing was done.
	ExitUsage = 2
)

// Streams are the command's input and outputs, injected so tests can use buffers.
type Streams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
}

// command is the shape of every kubefence command, kubectl's: an Options struct whose Complete
// turns flags and arguments into what Run needs (the printer, parsed values, clients, a loaded
// plan), whose Validate checks what must be given and what must not be combined, and whose Run
// does the work, writing to the injected streams. Complete and Validate may read files but
// change nothing; an error from either is the caller's (exit 2).
type command interface {
	Complete(args []string) error
	Validate() error
	Run(ctx context.Context) error
}

// runE runs o as a cobra RunE: Complete, Validate, then Run with the command's context, which
// Main cancels on SIGINT or SIGTERM.
func runE(o command) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, a []string) error {
		if err := o.Complete(a); err != nil {
			return usage(err)
		}
		if err := o.Validate(); err != nil {
			return usage(err)
		}
		err := o.Run(cmd.Context())
		if h, ok := o.(interface{ hint(error) error }); ok {
			return h.hint(err) // the plan's path in the advice
		}
		return err
	}
}

// usageError marks an error as the caller's (bad flags, arguments or input files): exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// UsageErrorf returns an error that makes kubefence exit with ExitUsage.
func UsageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

func usage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// globals are the options every command shares.
type globals struct {
	streams  Streams
	logLevel string
	log      *slog.Logger
	logOut   *logging.BufferedWriter
}

// logger returns the process logger, built from --log-level on first use.
func (g *globals) logger() *slog.Logger {
	if g.log == nil {
		level, _ := logging.ParseLevel(g.logLevel) // validated in PersistentPreRunE
		g.logOut = logging.NewBufferedWriter(g.streams.ErrOut, 100*time.Millisecond)
		g.log = logging.New(g.logOut, level)
		logging.RouteKlog(g.log) // the Kubernetes libraries' lines too, in one format
	}
	return g.log
}

func (g *globals) close() {
	if g.logOut != nil {
		_ = g.logOut.Close()
	}
}

// NewRootCommand builds the kubefence command tree.
func NewRootCommand(streams Streams) (*cobra.Command, func()) {
	g := &globals{streams: streams}
	root := &cobra.Command{
		Use:   "kubefence",
		Short: "Move a Kubernetes control plane to a new etcd with a write fence instead of downtime",
		Long: `kubefence moves a Kubernetes control plane to a new storage backend (a new etcd cluster,
a new etcd version, etcd v2 data migrated to v3) while clients keep working.

'kubefence proxy' stands where the API load balancer stood. 'kubefence fence on' makes it
read-only: reads and watches flow, writes get 429 + Retry-After (client-go retries them by
itself; clients that do not retry see an error). While fenced the proxy can be switched to a new apiserver, then 'fence off' reopens writes.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := logging.ParseLevel(g.logLevel); err != nil {
				return usage(err)
			}
			return nil
		},
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	root.PersistentFlags().StringVarP(&g.logLevel, "log-level", "v", "info", "log level: debug, info, warn or error (logs go to stderr)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage(err) })

	root.AddCommand(
		newVersionCommand(g),
		newProxyCommand(g),
		newFenceCommand(g),
		newBackendCommand(g),
		newCutoverCommand(g),
		newMigrateCommand(g),
	)
	return root, g.close
}

// Main runs kubefence with args and returns the process exit code.
func Main(args []string, in io.Reader, out, errOut io.Writer) int {
	root, closeLogs := NewRootCommand(Streams{In: in, Out: out, ErrOut: errOut})
	root.SetArgs(args)
	ctx, stop := signalContext(errOut, os.Exit)
	defer stop()
	cmd, err := root.ExecuteContextC(ctx)
	closeLogs()
	if err == nil {
		return ExitOK
	}
	fmt.Fprintf(errOut, "error: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) || isCobraUsageError(err) {
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintf(errOut, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return ExitUsage
	}
	return ExitFailure
}

// signalContext is the one signal handler: SIGINT, SIGTERM and SIGHUP (a closed terminal, a
// dropped SSH session) cancel the context every command runs with. A running proxy then shuts
// down gracefully; an offline operation stops where it is (any etcd it started is killed with
// it, as after a crash) and the same command resumes it; a cutover past its switch finishes the
// window's last steps first. A second SIGINT or SIGTERM
// exits at once (exit), as kill -9 would, for whoever cannot wait for that (a second SIGHUP
// does not: a closing terminal sends two). stop releases the signals.
func signalContext(errOut io.Writer, exit func(int)) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	// A reader of stdout or stderr that went away (a '| tee' closed with the terminal) makes
	// writes fail with EPIPE instead of killing the process, whatever it is in the middle of.
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			cancel(fmt.Errorf("%v signal received", sig))
		case <-done:
			return
		}
		for {
			select {
			case sig := <-sigs:
				if sig == syscall.SIGHUP {
					// A closed terminal sends its job SIGHUP more than once (the shell, then
					// the kernel): only an operator's second Ctrl-C or SIGTERM exits at once.
					continue
				}
				fmt.Fprintf(errOut, "error: a second %v signal: exiting at once\n", sig)
				exit(ExitFailure)
				return
			case <-done:
				return
			}
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		signal.Stop(pipe)
		close(done)
		cancel(nil)
	}
}

// isCobraUsageError recognises the one usage error cobra makes itself without passing it through
// the flag error func or an Args validator: an unknown subcommand.
func isCobraUsageError(err error) bool {
	return strings.HasPrefix(err.Error(), "unknown command")
}

// args wraps a cobra argument validator so that its errors exit with ExitUsage.
func args(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error { return usage(v(cmd, a)) }
}

// annotationGroup marks a command that only groups subcommands (groupCommand): it runs only to
// print its help, so the reference shows no usage line for it.
const annotationGroup = "kubefence.io/group"

// groupCommand makes cmd a group of subcommands, as kubectl's DefaultSubCommandRun: run alone
// it prints its help; with an argument, which cannot be one of its subcommands (cobra would have
// run that), it fails with ExitUsage. Cobra checks subcommand names only under the root and
// prints a command's help without checking its arguments when it has no Run, so a mistyped
// subcommand ("fence of") would print help and exit 0 having done nothing.
func groupCommand(cmd *cobra.Command, subs ...*cobra.Command) *cobra.Command {
	cmd.Args = noSubcommandArgs
	cmd.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
	cmd.Annotations = map[string]string{annotationGroup: "true"}
	cmd.AddCommand(subs...)
	return cmd
}

func noSubcommandArgs(cmd *cobra.Command, a []string) error {
	if len(a) == 0 {
		return nil
	}
	err := UsageErrorf("unknown command %q for %q", a[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(a[0]); len(s) > 0 {
		err = UsageErrorf("%v: did you mean %s?", err, strings.Join(s, " or "))
	}
	return err
}
