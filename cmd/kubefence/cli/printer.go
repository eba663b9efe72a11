package cli

import (
	"encoding/json"
	"io"

	"github.com/spf13/cobra"
)

// addOutputFlag adds -o/--output: a human table by default, or stable json.
func addOutputFlag(cmd *cobra.Command, out *string) {
	cmd.Flags().StringVarP(out, "output", "o", "", "output format: empty for human-readable, or json")
}

func validateOutput(o string) error {
	switch o {
	case "", "json":
		return nil
	}
	return UsageErrorf("unknown output format %q: use -o json or leave it out", o)
}

// printJSON writes v as indented JSON, the one machine-readable format kubefence prints.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
