package policy

import (
	"bytes"
	"encoding/json"
	"mime"
)

// MaxDeleteBodyBytes bounds the DeleteOptions body the fence reads to decide a dry run; a larger
// body is not a dry run. Real DeleteOptions are a few hundred bytes.
const MaxDeleteBodyBytes = 64 << 10

// DeleteOptionsDryRun reports whether a DELETE body is DeleteOptions whose dryRun is ["All"]
// (every value "All", at least one), exactly as kube-apiserver would read it. Anything it cannot
// be sure of is not a dry run: a media type other than JSON, JSON that does not parse, a dryRun
// that is not a list of strings. Keys are matched case-sensitively and the last of duplicate keys
// wins, as in the apiserver's decoder (Go's encoding/json alone would match "DRYRUN" too).
func DeleteOptionsDryRun(contentType string, body []byte) bool {
	if contentType != "" {
		mt, _, err := mime.ParseMediaType(contentType)
		if err != nil || mt != "application/json" {
			return false
		}
	}
	if len(body) == 0 || len(body) > MaxDeleteBodyBytes {
		return false
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&fields); err != nil || dec.More() {
		return false
	}
	raw, ok := fields["dryRun"]
	if !ok {
		return false
	}
	var vals []string
	if err := json.Unmarshal(raw, &vals); err != nil || len(vals) == 0 {
		return false
	}
	for _, v := range vals {
		if v != "All" {
			return false
		}
	}
	return true
}
