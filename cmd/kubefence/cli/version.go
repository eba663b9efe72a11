package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/kubefence/kubefence/internal/version"
)

type versionOptions struct {
	printOptions
}

func newVersionCommand(g *globals) *cobra.Command {
	o := &versionOptions{printOptions{Streams: g.streams}}
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the kubefence version",
		Args:  args(cobra.NoArgs),
		RunE:  runE(o),
	}
	o.output.addFlags(cmd)
	return cmd
}

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
