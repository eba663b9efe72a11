package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/kubefence/kubefence/internal/version"
)

type versionOptions struct {
	Streams
	print   printFlags
	printer printer
}

func newVersionCommand(g *globals) *cobra.Command {
	o := &versionOptions{Streams: g.streams}
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the kubefence version",
		Args:  args(cobra.NoArgs),
		RunE:  runE(o),
	}
	o.print.addFlags(cmd)
	return cmd
}

func (o *versionOptions) Complete([]string) (err error) {
	o.printer, err = o.print.toPrinter()
	return err
}

func (o *versionOptions) Validate() error { return nil }

func (o *versionOptions) Run(context.Context) error {
	info := version.Get()
	return o.printer.print(o.Out, info, func(w io.Writer) {
		fmt.Fprintf(w, "kubefence %s", info.Version)
		if info.Commit != "" {
			fmt.Fprintf(w, " (commit %.12s", info.Commit)
			if info.Modified {
				fmt.Fprint(w, ", modified")
			}
			fmt.Fprint(w, ")")
		}
		fmt.Fprintf(w, " %s %s\n", info.GoVersion, info.Platform)
	})
}
