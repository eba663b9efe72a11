package proxy

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/kubefence/kubefence/proxy/admin"
)

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Status())
	})
	mux.HandleFunc("POST /v1/fence", func(w http.ResponseWriter, r *http.Request) {
		req, ok := readFenceRequest(w, r)
		if !ok {
			return
		}
		var resp admin.FenceResponse
		var err error
		if req.Fenced {
			wait := time.Duration(req.WaitTimeout)
			if wait <= 0 {
				wait = admin.DefaultWaitTimeout
			}
			resp, err = s.FenceOn(r.Context(), req.Reason, req.Mode, wait)
		} else {
			resp, err = s.FenceOff(req.ExpectBackend)
		}
		switch {
		case errors.Is(err, ErrUnconfirmed), errors.Is(err, ErrUnchecked), errors.Is(err, ErrWrongBackend), errors.Is(err, ErrConcurrentChange):
			writeJSON(w, http.StatusConflict, admin.Error{Error: err.Error()})
		case errors.Is(err, ErrBadRequest):
			writeJSON(w, http.StatusBadRequest, admin.Error{Error: err.Error()})
		case err != nil:
			writeJSON(w, http.StatusInternalServerError, admin.Error{Error: err.Error()})
		default:
			writeJSON(w, http.StatusOK, resp)
		}
	})
	mux.HandleFunc("GET /v1/writes", func(w http.ResponseWriter, r *http.Request) {
		since, err := time.Parse(time.RFC3339Nano, r.URL.Query().Get("since"))
		if err != nil {
			writeJSON(w, http.StatusBadRequest, admin.Error{Error: "since: want an RFC 3339 time: " + err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, s.writes.since(since))
	})
	mux.HandleFunc("POST /v1/backend", func(w http.ResponseWriter, r *http.Request) {
		var req admin.BackendRequest
		if !readJSON(w, r, &req) {
			return
		}
		resp, err := s.SetBackend(r.Context(), req)
		switch {
		case errors.Is(err, ErrNotFenced), errors.Is(err, ErrBackendNotAllowed), errors.Is(err, ErrWritesInFlight), errors.Is(err, ErrConcurrentChange):
			writeJSON(w, http.StatusConflict, admin.Error{Error: err.Error()})
		case errors.Is(err, ErrNotSaved):
			writeJSON(w, http.StatusInternalServerError, admin.Error{Error: err.Error()})
		case err != nil:
			writeJSON(w, http.StatusBadRequest, admin.Error{Error: err.Error()})
		default:
			writeJSON(w, http.StatusOK, resp)
		}
	})
	mux.HandleFunc("POST /v1/backend/prepare", func(w http.ResponseWriter, r *http.Request) {
		var req admin.PrepareRequest
		if !readJSON(w, r, &req) {
			return
		}
		resp, err := s.PrepareBackend(r.Context(), req)
		switch {
		case errors.Is(err, ErrBackendNotAllowed):
			writeJSON(w, http.StatusConflict, admin.Error{Error: err.Error()})
		case err != nil:
			writeJSON(w, http.StatusBadRequest, admin.Error{Error: err.Error()})
		default:
			writeJSON(w, http.StatusOK, resp)
		}
	})
	return mux
}

// readJSON decodes the request's body, one JSON document with known fields only, into v; it
// answers 400 otherwise.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, next := dec.Token(); next != io.EOF {
			err = errors.New("more than one JSON document")
		}
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, admin.Error{Error: "bad request body: " + err.Error()})
		return false
	}
	return true
}

// readFenceRequest reads a fence request, which must say "fenced": false is also what a
// missing field decodes to, and a malformed request must not open writes.
func readFenceRequest(w http.ResponseWriter, r *http.Request) (admin.FenceRequest, bool) {
	var body struct {
		admin.FenceRequest
		Fenced *bool `json:"fenced"`
	}
	if !readJSON(w, r, &body) {
		return admin.FenceRequest{}, false
	}
	req := body.FenceRequest
	switch {
	case body.Fenced == nil:
		writeJSON(w, http.StatusBadRequest, admin.Error{Error: `bad request body: give "fenced": true (fence on) or false (fence off)`})
		return req, false
	case *body.Fenced && req.ExpectBackend != "":
		writeJSON(w, http.StatusBadRequest, admin.Error{Error: `bad request body: "expectBackend" goes with fence off ("fenced": false) only`})
		return req, false
	}
	req.Fenced = *body.Fenced
	return req, true
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
