package cli

import (
	"encoding/json"
	"io"

	"github.com/spf13/cobra"
)

// printFlags is -o/--output, as kubectl's PrintFlags: the one place that registers the flag,
// checks its value and turns it into a printer.
type printFlags struct {
	format string
}

// addFlags adds -o/--output: a human form by default, or stable json.
func (f *printFlags) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.format, "output", "o", "", "output format: empty for human-readable, or json")
}

// toPrinter returns the printer -o asks for; an unknown format is a usage error.
func (f *printFlags) toPrinter() (printer, error) {
	switch f.format {
	case "":
		return printer{}, nil
	case "json":
		return printer{json: true}, nil
	}
	return printer{}, UsageErrorf("unknown output format %q: use -o json or leave it out", f.format)
}

// printOptions are what every command that prints embeds, as kubectl's Options embed IOStreams
// and PrintFlags: the injected streams, -o, and the printer Complete makes of it.
type printOptions struct {
	Streams
	output  printFlags
	printer printer
}

func (o *printOptions) Complete([]string) (err error) {
	o.printer, err = o.output.toPrinter()
	return err
}

// Validate is for the commands that have nothing more to check than -o, which Complete did.
func (o *printOptions) Validate() error { return nil }

// printer prints a command's output either as JSON, the one machine-readable format kubefence
// prints (stable: fields are only ever added), or in the human form the command gives it.
type printer struct {
	json bool
}

// print writes a command's result v: indented JSON with -o json, else human(w).
func (p printer) print(w io.Writer, v any, human func(w io.Writer)) error {
	if p.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	human(w)
	return nil
}

// printLine writes one item v of a stream (a cutover's events): one compact JSON object per
// line with -o json, else human(w).
func (p printer) printLine(w io.Writer, v any, human func(w io.Writer)) error {
	if p.json {
		return json.NewEncoder(w).Encode(v)
	}
	human(w)
	return nil
}

// progress writes lines meant for a person watching a long command (steps as they start and
// end); with -o json the output is the result alone, and progress writes nothing.
func (p printer) progress(w io.Writer, human func(w io.Writer)) {
	if !p.json {
		human(w)
	}
}
