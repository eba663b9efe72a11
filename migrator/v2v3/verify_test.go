package v2v3

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDecodesTo checks the read-back's value comparison against encoding/json's decoding, on
// encodings etcd's v2store writes and on ones it does not (older encoders, hand edits).
func TestDecodesTo(t *testing.T) {
	for _, tc := range []struct {
		name, quoted, value string
		want                bool
		wantErr             bool
	}{
		{"plain", `"abc"`, "abc", true, false},
		{"plain, other value", `"abc"`, "abd", false, false},
		{"empty", `""`, "", true, false},
		{"escaped quotes", `"{\"a\":1}"`, `{"a":1}`, true, false},
		{"escaped, other value", `"{\"a\":1}"`, `{"a":2}`, false, false},
		{"escaped, value one byte short", `"{\"a\":1}"`, `{"a":1`, false, false},
		{"html escapes", `"\u003cb\u003e\u0026"`, "<b>&", true, false},
		{"an older encoder's \\u0008", `"\u0008x"`, "\bx", true, false},
		{"a non-canonical \\u00e9", `"\u00e9"`, "é", true, false},
		{"raw UTF-8", `"é 中文 😀"`, "é 中文 😀", true, false},
		{"a lone surrogate decodes to U+FFFD", `"\ud800"`, "\ufffd", true, false},
		{"U+FFFD is not the bad byte it replaced", `"\ufffd"`, "\xff", false, false},
		{"a bad byte decodes to U+FFFD", "\"a\xffb\"", "a\xffb", false, false},
		{"a raw control character does not decode", "\"a\x01\"", "a\x01", false, true},
		{"a bad escape does not decode", `"\q"`, "q", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ref string
			refErr := json.Unmarshal([]byte(tc.quoted), &ref)
			if (refErr != nil) != tc.wantErr || (refErr == nil && (ref == tc.value) != tc.want) {
				t.Fatalf("the table disagrees with encoding/json: %q decodes to %q, %v", tc.quoted, ref, refErr)
			}
			v := &verifier{}
			for range 2 { // the encoder is reused
				got, err := v.decodesTo([]byte(tc.quoted), []byte(tc.value))
				if got != tc.want || (err != nil) != tc.wantErr {
					t.Errorf("decodesTo(%s, %q) = %v, %v; want %v (error: %v)", tc.quoted, tc.value, got, err, tc.want, tc.wantErr)
				}
			}
		})
	}
}

// TestVerifyFindsWrongValues writes keys, then checks the verifier reports a changed value of
// each kind (streamed with and without escapes, given) and passes an unchanged one.
func TestVerifyFindsWrongValues(t *testing.T) {
	data := []byte(`xx"plain"xx"{\"a\":\"b\"}"`)
	kvs := []KV{
		{Key: []byte("/p"), raw: span{off: 3, n: 5}, CreateRevision: 5, ModRevision: 5},
		{Key: []byte("/e"), raw: span{off: 12, n: 13, esc: true}, CreateRevision: 6, ModRevision: 6},
		{Key: []byte("/g"), Value: []byte("given"), CreateRevision: 7, ModRevision: 7},
	}
	for _, tc := range []struct {
		name   string
		stored []string
		want   string
	}{
		{"as written", []string{"plain", `{"a":"b"}`, "given"}, ""},
		{"plain value changed", []string{"plaiN", `{"a":"b"}`, "given"}, `key "/p"`},
		{"escaped value changed", []string{"plain", `{"a":"c"}`, "given"}, `key "/e"`},
		{"given value changed", []string{"plain", `{"a":"b"}`, "givem"}, `key "/g"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &verifier{e: expected{data: data, kvs: kvs}}
			for i, s := range tc.stored {
				w := kvs[i]
				w.Value, w.raw = []byte(s), span{}
				val, err := marshalKV(&w, nil)
				if err != nil {
					t.Fatal(err)
				}
				v.check(revBytes(w.ModRevision), val)
			}
			err := v.result()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("verification: %v; want a problem naming %q", err, tc.want)
			}
		})
	}
}
