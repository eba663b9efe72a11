package cli

import (
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
)

// MarkdownReference renders every command's usage, description and flags as Markdown
// (docs/cli.md is this output; a test keeps them equal).
func MarkdownReference() string {
	root, _ := NewRootCommand(Streams{})
	root.InitDefaultCompletionCmd()
	var b strings.Builder
	b.WriteString("# kubefence command reference\n\n")
	b.WriteString("Generated from the code (`go test ./cmd/kubefence/cli -run TestCLIReference -update`); do not edit by hand.\n\n")
	b.WriteString("## Exit codes\n\n")
	b.WriteString("| code | meaning |\n| --- | --- |\n")
	fmt.Fprintf(&b, "| %d | success |\n", ExitOK)
	fmt.Fprintf(&b, "| %d | the command ran and failed (a timeout expired, the proxy refused, a check found a mismatch); what was left in place is said on stderr |\n", ExitFailure)
	fmt.Fprintf(&b, "| %d | invalid command line or input file; nothing was done |\n\n", ExitUsage)
	b.WriteString("Logs go to stderr as `log/slog` text lines; results go to stdout. `-o json` output is stable: fields are only ever added.\n\n")
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" {
			return
		}
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", c.CommandPath(), c.Short)
		if c.Long != "" {
			b.WriteString(c.Long + "\n\n")
		}
		if c.Runnable() && c.Annotations[annotationGroup] == "" {
			fmt.Fprintf(&b, "```\n%s\n```\n\n", c.UseLine())
		}
		if fl := c.NonInheritedFlags().FlagUsages(); strings.TrimSpace(fl) != "" {
			fmt.Fprintf(&b, "Flags:\n\n```\n%s```\n\n", fl)
		}
		subs := c.Commands()
		sort.Slice(subs, func(i, j int) bool { return subs[i].Name() < subs[j].Name() })
		for _, s := range subs {
			walk(s)
		}
	}
	walk(root)
	return b.String()
}
