package router

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error bodies. The status decides the shape's codes:
//
//	status  invoke paths (SageMaker)                OpenAI paths
//	400     {"ErrorCode":"ValidationError",...}     type invalid_request_error, code invalid_request
//	404     ErrorCode "ValidationError"              type invalid_request_error, code not_found
//	413     ErrorCode "ValidationError"              type invalid_request_error, code request_too_large
//	424/502 ErrorCode "ModelError" (424)             type server_error, code upstream_error (502)
//	503     ErrorCode "ServiceUnavailable"           type server_error, code no_instance_available
//
// SageMaker's runtime answers ValidationError for every client mistake
// (unknown endpoint included), so invoke clients that switch on ErrorCode keep
// working; the status tells them apart. Every router-made error carries
// X-Prefixrouter-Error: the short code, for tests and logs.

// apiKind tells which client API a path speaks.
type apiKind uint8

const (
	kindInvoke apiKind = iota
	kindChat
	kindCompletions
)

func (k apiKind) openAI() bool { return k != kindInvoke }

// retryAfterSeconds is what 503 answers put in Retry-After: breakers half-open
// and in-flight requests finish on that scale.
const retryAfterSeconds = 1

type sageMakerError struct {
	ErrorCode string `json:"ErrorCode"`
	Message   string `json:"Message"`
}

type openAIError struct {
	Error openAIErrorBody `json:"error"`
}

type openAIErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// writeError answers a router-made error in the shape of the path's API.
// code is a short machine-readable reason (the OpenAI code).
func writeError(w http.ResponseWriter, kind apiKind, status int, code, msg string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Prefixrouter-Error", code)
	if status == http.StatusServiceUnavailable {
		h.Set("Retry-After", strconv.Itoa(retryAfterSeconds))
	}
	var body any
	if kind.openAI() {
		typ := "invalid_request_error"
		if status >= 500 {
			typ = "server_error"
		}
		body = openAIError{Error: openAIErrorBody{Message: msg, Type: typ, Code: code}}
	} else {
		ec := "ValidationError"
		switch {
		case status == http.StatusServiceUnavailable:
			ec = "ServiceUnavailable"
		case status == http.StatusFailedDependency || status == http.StatusBadGateway:
			ec = "ModelError"
		case status >= 500:
			ec = "InternalFailure"
		}
		body = sageMakerError{ErrorCode: ec, Message: msg}
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// upstreamFailureStatus is the status when no candidate produced a response:
// 424 ModelError like SageMaker on invoke paths; 502 on OpenAI paths, which
// OpenAI clients retry.
func upstreamFailureStatus(kind apiKind) int {
	if kind.openAI() {
		return http.StatusBadGateway
	}
	return http.StatusFailedDependency
}
