package router

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error bodies of router-made errors (upstream responses, whatever their
// status, pass through unchanged):
//
//	invoke paths: {"ErrorCode":"<SageMaker code>","Message":"..."}
//	OpenAI paths: {"error":{"message":"...","type":"<type>","code":"<code>"}}
//
//	status  case                              ErrorCode           type                   code
//	400     malformed JSON                    ValidationError     invalid_request_error  invalid_json
//	400     bad tenant id                     ValidationError     invalid_request_error  invalid_tenant_id
//	400     unreadable body                   ValidationError     invalid_request_error  invalid_request
//	404     unknown endpoint                  ValidationError     invalid_request_error  endpoint_not_found
//	404     unknown model / adapter           ValidationError     invalid_request_error  model_not_found
//	413     body over MaxBodyBytes            ValidationError     invalid_request_error  request_too_large
//	424     invoke: no candidate answered     ModelError          -                      upstream_error
//	502     OpenAI: no candidate answered     -                   server_error           upstream_error
//	503     no instance / all breakers open   ServiceUnavailable  server_error           no_instance_available
//	503     no snapshot loaded yet            ServiceUnavailable  server_error           fleet_not_loaded
//
// SageMaker's runtime answers ValidationError for every client mistake
// (unknown endpoint included), so invoke clients that switch on ErrorCode keep
// working; the status tells the cases apart. 503s carry Retry-After. Every
// router-made error carries X-Prefixrouter-Error: <code>, for tests and logs.

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
