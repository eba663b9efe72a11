package admin

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestEachNamesEveryProxyThatFailed(t *testing.T) {
	g := Group{{Name: "a", Client: NewClient("/a")}, {Name: "b", Client: NewClient("/b")}, {Name: "c", Client: NewClient("/c")}}
	res, err := Each(context.Background(), g, func(_ context.Context, c *Client) (string, error) {
		if c == g[1].Client {
			return "", errors.New("unreachable")
		}
		return "ok", nil
	})
	if err == nil || !strings.Contains(err.Error(), "1 of 3 proxies") || !strings.Contains(err.Error(), "proxy b: unreachable") {
		t.Fatalf("error %v, want it to name proxy b", err)
	}
	if len(res) != 3 || res[0].Value != "ok" || res[1].Error != "unreachable" || res[2].Proxy != "c" {
		t.Fatalf("results %+v", res)
	}
	if _, err := Each(context.Background(), g, func(context.Context, *Client) (int, error) { return 1, nil }); err != nil {
		t.Fatalf("all acknowledged: %v", err)
	}
}
