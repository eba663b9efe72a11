package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kubefence/kubefence/internal/version"
)

type versionOptions struct {
	output string
}

func newVersionCommand(g *globals) *cobra.Command {
	o := &versionOptions{}
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the kubefence version",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := validateOutput(o.output); err != nil {
				return err
			}
			info := version.Get()
			if o.output == "json" {
				return printJSON(g.streams.Out, info)
			}
			fmt.Fprintf(g.streams.Out, "kubefence %s", info.Version)
			if info.Commit != "" {
				fmt.Fprintf(g.streams.Out, " (commit %.12s", info.Commit)
				if info.Modified {
					fmt.Fprint(g.streams.Out, ", modified")
				}
				fmt.Fprint(g.streams.Out, ")")
			}
			fmt.Fprintf(g.streams.Out, " %s %s\n", info.GoVersion, info.Platform)
			return nil
		},
	}
	addOutputFlag(cmd, &o.output)
	return cmd
}
