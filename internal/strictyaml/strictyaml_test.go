package strictyaml

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type doc struct {
	Name  string   `yaml:"name"`
	Items []string `yaml:"items"`
}

func TestDecode(t *testing.T) {
	cases := []struct {
		name string
		data string
		want string // substring of the error; "" for success
	}{
		{"ok", "name: a\nitems: [x, y]\n", ""},
		// A second document (files joined with cat) would be dropped without a word.
		{"two documents", "name: a\n---\nname: b\n", "line 2: a second YAML document"},
		{"a document end marker", "name: a\n...\n", ""},
		// A trailing separator (or an empty document after it) is no second document.
		{"a trailing separator", "name: a\n---\n", ""},
		{"an empty document after it", "name: a\n---\n# nothing\n---\n", ""},
		{"unknown field", "name: a\nitem: [x]\n", "line 2: field item not found"},
		{"two unknown fields", "nam: a\nitem: [x]\n", "line 1: field nam not found"},
		{"syntax", "name: a\nitems: [\n", "line 2"},
		{"wrong type", "name: [a]\n", "line 1: cannot unmarshal"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var d doc
			err := Decode([]byte(tc.data), &d)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if d.Name != "a" {
					t.Errorf("name %q, want a", d.Name)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "yaml:") {
				t.Errorf("error %q: want it to contain %q and no yaml: prefix", err, tc.want)
			}
		})
	}
}

func TestDecodeKeepsTypeError(t *testing.T) {
	var d doc
	err := Decode([]byte("nam: a\nitem: [x]\n"), &d)
	var te *yaml.TypeError
	if !errors.As(err, &te) || len(te.Errors) != 2 {
		t.Fatalf("error %v: want a *yaml.TypeError with both fields", err)
	}
}

func TestDecodeEmpty(t *testing.T) {
	for _, data := range []string{"", "\n", "# only a comment\n"} {
		var d doc
		if err := Decode([]byte(data), &d); !errors.Is(err, ErrEmpty) {
			t.Errorf("Decode(%q) = %v, want ErrEmpty", data, err)
		}
	}
}

func TestLines(t *testing.T) {
	l, err := LinesOf([]byte("# header\nname: a\nitems:\n- x\n-   y\n\n- z\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Key("name"); got != 2 {
		t.Errorf("Key(name) = %d, want 2", got)
	}
	if got := l.Key("missing"); got != 1 {
		t.Errorf("Key(missing) = %d, want 1", got)
	}
	if got := l.Items("items"); !slices.Equal(got, []int{4, 5, 7}) {
		t.Errorf("Items(items) = %v, want [4 5 7]", got)
	}
	if got := l.Items("name"); got != nil {
		t.Errorf("Items(name) = %v, want nil: not a sequence", got)
	}
	for _, data := range []string{"", "- a\n", "scalar\n"} {
		l, err := LinesOf([]byte(data))
		if err != nil {
			t.Fatal(err)
		}
		if l.Key("name") != 1 || l.Items("items") != nil {
			t.Errorf("LinesOf(%q): want defaults for a document that is not a mapping", data)
		}
	}
}
