package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// statusBody encodes a Kubernetes Status, the error shape kubectl prints well and client-go decodes.
func statusBody(code int, reason metav1.StatusReason, message string, retryAfter int) []byte {
	st := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  message,
		Reason:   reason,
		Code:     int32(code),
	}
	if retryAfter > 0 {
		st.Details = &metav1.StatusDetails{RetryAfterSeconds: int32(retryAfter)}
	}
	b, err := json.Marshal(st)
	if err != nil { // a metav1.Status always marshals
		panic(err)
	}
	return append(b, '\n')
}

// writeStatus answers with a Status body; retryAfter > 0 adds the Retry-After header.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, message string, retryAfter int) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(code)
	_, _ = w.Write(statusBody(code, reason, message, retryAfter))
}

// holdFullBody is the 429 body for a write hold mode would hold but cannot: why names the bound
// of the waiting room it is past.
func holdFullBody(reason string, why error, retryAfter int) []byte {
	msg := fmt.Sprintf("kubefence: the Kubernetes API is fenced for a control-plane migration%s; writes are held until it lifts, "+
		"but %s; retry in %ds (client-go retries by itself). Reads and watches still work.", fenceWhy(reason), why, retryAfter)
	return statusBody(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, msg, retryAfter)
}

// ruleRefusalBody is the 429 body for a request a rule of the fence policy refuses (rule: which
// one), read or write: not the fence's own, which says writes wait and reads work.
func ruleRefusalBody(reason, rule string, retryAfter int) []byte {
	msg := fmt.Sprintf("kubefence: the Kubernetes API is fenced for a control-plane migration%s, and the fence policy (%s) refuses this request while it is; retry in %ds.", fenceWhy(reason), rule, retryAfter)
	return statusBody(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, msg, retryAfter)
}

// fenceWhy is a fence's reason as a 429's message carries it.
func fenceWhy(reason string) string {
	if reason == "" {
		return ""
	}
	return " (" + reason + ")"
}

// refusalBody is the 429 body for the current fence: built once per fence change, not per request.
func refusalBody(reason string, retryAfter int) []byte {
	msg := fmt.Sprintf("kubefence: the Kubernetes API is fenced read-only for a control-plane migration%s; "+
		"writes are refused, retry in %ds (client-go retries by itself). Reads and watches still work.", fenceWhy(reason), retryAfter)
	return statusBody(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, msg, retryAfter)
}
