package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// V2Client writes to etcd's v2 API (etcd 3.4 with --enable-v2), the way v2 clients did.
type V2Client struct {
	Endpoint string
	hc       http.Client
}

// V2Result is the part of a v2 answer the tests look at.
type V2Result struct {
	Action    string `json:"action"`
	ErrorCode int    `json:"errorCode"`
	Message   string `json:"message"`
	Node      struct {
		Key           string `json:"key"`
		Value         string `json:"value"`
		CreatedIndex  uint64 `json:"createdIndex"`
		ModifiedIndex uint64 `json:"modifiedIndex"`
	} `json:"node"`
}

// Do sends one v2 request: method PUT, POST, DELETE or GET on key with form parameters. A key
// that does not exist is an answer with ErrorCode 100, not an error.
func (c *V2Client) Do(ctx context.Context, method, key string, params url.Values) (V2Result, error) {
	var r V2Result
	u := strings.TrimSuffix(c.Endpoint, "/") + "/v2/keys" + key
	var body io.Reader
	if method == http.MethodDelete || method == http.MethodGet {
		if q := params.Encode(); q != "" {
			u += "?" + q
		}
	} else {
		body = strings.NewReader(params.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return r, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("v2 %s %s: %s: %s", method, key, resp.Status, data)
	}
	return r, nil
}
