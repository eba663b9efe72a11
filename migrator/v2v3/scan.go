package v2v3

import (
	"bytes"
	"errors"
	"fmt"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// The v2 store's snapshot is the JSON encoding/json makes of v2store's store struct:
//
//	{"Root":NODE,"WatcherHub":{...},"CurrentIndex":N,"Stats":{...},"CurrentVersion":2}
//	NODE = {"Path":"/1/a","CreatedIndex":N,"ModifiedIndex":N,"ExpireTime":"RFC 3339",
//	        "Value":"...","Children":{"name":NODE,...} or null}
//
// scanner walks it in place, node by node, without decoding values: a value is kept as the
// position of its JSON string in the snapshot, so memory grows with the number of keys, not
// with the size of the data. Field order is encoding/json's (the struct's), which every etcd
// release since 2.0 has written; a node whose Children come before its other fields is
// reported as an error rather than guessed at.

// span is a JSON string's contents (without the quotes) at off in the snapshot.
type span struct {
	off int64
	n   int32
	esc bool // contains backslash escapes
}

// v2Node is one node as the scanner sees it.
type v2Node struct {
	path              string
	created, modified uint64
	expire            time.Time
	dir               bool
	value             span
}

// scanVisitor decides, for each node (before its children are read), whether it goes into the
// replay overlay, and whether its children must follow it there.
type scanVisitor interface {
	node(n *v2Node, forced bool) (keep bool, forceChildren bool, err error)
	// leave is called after every directory's children; kept says whether node kept it.
	leave(n *v2Node, kept bool)
}

type scanner struct {
	b     []byte
	i     int
	v     scanVisitor
	tick  func(pos int) // progress and page release, every few MB
	next  int
	index uint64 // CurrentIndex
}

const tickEvery = 32 << 20

func (s *scanner) errf(format string, a ...any) error {
	return fmt.Errorf("v2 snapshot JSON at byte %d: %s", s.i, fmt.Sprintf(format, a...))
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) expect(c byte) error {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != c {
		return s.errf("expected %q", c)
	}
	s.i++
	return nil
}

// str reads a JSON string, returning its contents' bounds. It jumps from quote to quote with
// bytes.IndexByte (vectorised): a quote preceded by an odd run of backslashes is escaped.
func (s *scanner) str() (start, end int, esc bool, err error) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return 0, 0, false, s.errf("expected a string")
	}
	s.i++
	start = s.i
	for {
		q := bytes.IndexByte(s.b[s.i:], '"')
		if q < 0 {
			s.i = len(s.b)
			return 0, 0, false, s.errf("unterminated string")
		}
		end = s.i + q
		s.i = end + 1
		n := 0
		for n < end-start && s.b[end-1-n] == '\\' {
			n++
		}
		if n%2 == 0 {
			esc = esc || bytes.IndexByte(s.b[start:end], '\\') >= 0
			return start, end, esc, nil
		}
		esc = true
	}
}

func (s *scanner) goString() (string, error) {
	a, b, esc, err := s.str()
	if err != nil {
		return "", err
	}
	if !esc {
		return string(s.b[a:b]), nil
	}
	out, err := appendUnescaped(nil, s.b[a:b])
	return string(out), err
}

func (s *scanner) uint() (uint64, error) {
	s.ws()
	start := s.i
	var v uint64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		d := uint64(s.b[s.i] - '0')
		if v > (1<<64-1-d)/10 {
			return 0, s.errf("number out of range")
		}
		v = v*10 + d
		s.i++
	}
	if s.i == start {
		return 0, s.errf("expected an unsigned number")
	}
	return v, nil
}

func (s *scanner) literal(lit string) bool {
	if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return true
	}
	return false
}

// skip skips any JSON value.
func (s *scanner) skip() error {
	s.ws()
	if s.i >= len(s.b) {
		return s.errf("unexpected end")
	}
	switch c := s.b[s.i]; c {
	case '"':
		_, _, _, err := s.str()
		return err
	case '{', '[':
		close := byte('}')
		if c == '[' {
			close = ']'
		}
		s.i++
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == close {
			s.i++
			return nil
		}
		for {
			if c == '{' {
				if _, _, _, err := s.str(); err != nil {
					return err
				}
				if err := s.expect(':'); err != nil {
					return err
				}
			}
			if err := s.skip(); err != nil {
				return err
			}
			s.ws()
			if s.i < len(s.b) && s.b[s.i] == ',' {
				s.i++
				continue
			}
			return s.expect(close)
		}
	default:
		start := s.i
		for s.i < len(s.b) && s.b[s.i] != ',' && s.b[s.i] != '}' && s.b[s.i] != ']' && s.b[s.i] != ' ' && s.b[s.i] != '\n' {
			s.i++
		}
		if s.i == start {
			return s.errf("unexpected %q", c)
		}
		return nil
	}
}

// object calls field for each member of an object.
func (s *scanner) object(field func(key []byte) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil
	}
	for {
		a, b, _, err := s.str()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := field(s.b[a:b]); err != nil {
			return err
		}
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == ',' {
			s.i++
			continue
		}
		return s.expect('}')
	}
}

// store reads the top-level object.
func (s *scanner) store() error {
	seenRoot := false
	err := s.object(func(k []byte) error {
		switch string(k) {
		case "Root":
			seenRoot = true
			return s.node(false)
		case "CurrentIndex":
			v, err := s.uint()
			s.index = v
			return err
		default:
			return s.skip()
		}
	})
	if err != nil {
		return err
	}
	if s.ws(); s.i != len(s.b) {
		return s.errf("trailing data after the store")
	}
	if !seenRoot {
		return errors.New("v2 snapshot has no Root node")
	}
	return nil
}

const zeroTime = "0001-01-01T00:00:00Z"

// nodeField reads one of a node's fields before Children into n, and marks it in have.
func (s *scanner) nodeField(k string, n *v2Node, have *int) error {
	switch k {
	case "Path":
		p, err := s.goString()
		n.path, *have = p, *have|1
		return err
	case "CreatedIndex":
		v, err := s.uint()
		n.created, *have = v, *have|2
		return err
	case "ModifiedIndex":
		v, err := s.uint()
		n.modified, *have = v, *have|4
		return err
	case "ExpireTime":
		a, b, _, err := s.str()
		if err != nil {
			return err
		}
		*have |= 8
		if t := s.b[a:b]; string(t) != zeroTime {
			if n.expire, err = time.Parse(time.RFC3339Nano, string(t)); err != nil {
				return s.errf("ExpireTime %q: %v", t, err)
			}
		}
		return nil
	}
	// Value
	a, b, esc, err := s.str()
	if err != nil {
		return err
	}
	if b-a > 1<<31-1 {
		return s.errf("value larger than 2 GiB")
	}
	n.value, *have = span{off: int64(a), n: int32(b - a), esc: esc}, *have|16
	return nil
}

func (s *scanner) node(forced bool) error {
	if s.tick != nil && s.i >= s.next {
		s.tick(s.i)
		s.next = s.i + tickEvery
	}
	var n v2Node
	var have int // bit set of the fields read before Children
	decided, keep := false, false
	err := s.object(func(k []byte) error {
		switch string(k) {
		case "Path", "CreatedIndex", "ModifiedIndex", "ExpireTime", "Value":
			return s.nodeField(string(k), &n, &have)
		case "Children":
			if have != 31 {
				return s.errf("node %q: Children before its other fields; this snapshot was not written by etcd", n.path)
			}
			s.ws()
			n.dir = !s.literal("null")
			var force bool
			var err error
			if keep, force, err = s.v.node(&n, forced); err != nil {
				return err
			}
			decided = true
			if !n.dir {
				return nil
			}
			if err := s.object(func([]byte) error { return s.node(force) }); err != nil {
				return err
			}
			s.v.leave(&n, keep)
			return nil
		default:
			return s.skip()
		}
	})
	if err != nil {
		return err
	}
	if !decided { // no Children field at all: a file
		if have != 31 {
			return s.errf("node %q lacks fields", n.path)
		}
		_, _, err = s.v.node(&n, forced)
	}
	return err
}

// appendUnescaped appends the JSON string contents src, unescaped, to dst, the way
// encoding/json decodes them (a lone surrogate becomes U+FFFD).
func appendUnescaped(dst, src []byte) ([]byte, error) {
	for i := 0; i < len(src); {
		c := src[i]
		if c != '\\' {
			j := bytes.IndexByte(src[i:], '\\')
			if j < 0 {
				j = len(src) - i
			}
			dst = append(dst, src[i:i+j]...)
			i += j
			continue
		}
		if i+1 >= len(src) {
			return dst, errors.New("truncated escape")
		}
		switch e := src[i+1]; e {
		case '"', '\\', '/':
			dst = append(dst, e)
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, ok := hex4(src[i+2:])
			if !ok {
				return dst, errors.New("bad \\u escape")
			}
			i += 6
			if utf16.IsSurrogate(r) {
				r2, ok := rune(0), false
				if len(src)-i >= 6 && src[i] == '\\' && src[i+1] == 'u' {
					r2, ok = hex4(src[i+2:])
				}
				if dec := utf16.DecodeRune(r, r2); ok && dec != utf8.RuneError {
					r = dec
					i += 6
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default:
			return dst, fmt.Errorf("bad escape \\%c", e)
		}
		i += 2
	}
	return dst, nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
