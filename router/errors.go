package router

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error answers. Upstream responses pass through unchanged on the OpenAI
// paths; on the invoke paths an upstream non-2xx becomes SageMaker's
// ModelError (424, with OriginalStatusCode and OriginalMessage), as
// SageMaker Runtime answers when a container fails. Router-made errors:
//
//	invoke paths: X-Amzn-ErrorType: <type>
//	              {"ErrorCode":"<type>","Message":"...","message":"..."}
//	OpenAI paths: {"error":{"message":"...","type":"<type>","code":"<code>"}}
//
//	case                            invoke: status, type                 OpenAI: status, type   code
//	malformed JSON                  400 ValidationError                  400 invalid_request_error  invalid_json
//	bad tenant id                   400 ValidationError                  400 invalid_request_error  invalid_tenant_id
//	bad session id                  400 ValidationError                  -                          invalid_session_id
//	unreadable body                 400 ValidationError                  400 invalid_request_error  invalid_request
//	body over MaxBodyBytes          413 ValidationError                  413 invalid_request_error  request_too_large
//	unknown endpoint                400 ValidationError                  404 invalid_request_error  endpoint_not_found
//	unknown model / adapter         400 ValidationError                  404 invalid_request_error  model_not_found
//	model only on draining insts.   429 ModelNotReadyException           503 server_error           model_not_ready
//	no instance / breakers open     503 ServiceUnavailable               503 server_error           no_instance_available
//	no snapshot loaded (etcd)       530 InternalDependencyException      503 server_error           fleet_not_loaded
//	every candidate unreachable     530 InternalDependencyException      502 server_error           upstream_unreachable
//	no answer (timeout, reset)      424 ModelError                       502 server_error           upstream_error
//	upstream non-2xx                424 ModelError (Original*)           passed through             upstream_status
//	missing/wrong API key (keys on) 401 UnrecognizedClientException      401 invalid_request_error  invalid_api_key
//	router bug                      500 InternalFailure                  500 server_error           internal_error
//
// The type travels in X-Amzn-ErrorType, which AWS SDKs read to raise typed
// errors (*types.ValidationError ...); "Message" is the member the SDK's
// typed errors read, "message" the one generic AWS clients read, and
// "ErrorCode" what earlier versions answered. 503s carry Retry-After. Every
// router-made error carries X-Prefixrouter-Error: <code>, for tests and logs.
// docs/http-api.md has this table against SageMaker's.

// apiKind tells which client API a path speaks.
type apiKind uint8

const (
	kindInvoke apiKind = iota
	kindChat
	kindCompletions
)

func (k apiKind) openAI() bool { return k != kindInvoke }

// HeaderErrorType carries SageMaker's error type (AWS's restJson protocol).
const HeaderErrorType = "X-Amzn-Errortype" // canonical form of X-Amzn-ErrorType

// SageMaker Runtime's error types (the shapes of its service model).
const (
	errValidation         = "ValidationError"
	errModel              = "ModelError"
	errModelNotReady      = "ModelNotReadyException"
	errServiceUnavailable = "ServiceUnavailable"
	errInternalFailure    = "InternalFailure"
	errInternalDependency = "InternalDependencyException"
)

// statusInternalDependency is SageMaker's status for
// InternalDependencyException (non-standard; Cloudflare uses it too).
const statusInternalDependency = 530

// retryAfterSeconds is what 503 answers put in Retry-After: breakers half-open
// and in-flight requests finish on that scale.
const retryAfterSeconds = 1

type sageMakerError struct {
	ErrorCode          string `json:"ErrorCode"`
	Message            string `json:"Message"`
	LowerMessage       string `json:"message"`
	OriginalStatusCode int    `json:"OriginalStatusCode,omitempty"`
	OriginalMessage    string `json:"OriginalMessage,omitempty"`
}

type openAIError struct {
	Error openAIErrorBody `json:"error"`
}

type openAIErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// sageMakerType is the SageMaker error type of a router-made status on an
// invoke path.
func sageMakerType(status int) string {
	switch {
	case status == http.StatusFailedDependency:
		return errModel
	case status == http.StatusTooManyRequests:
		return errModelNotReady
	case status == http.StatusServiceUnavailable:
		return errServiceUnavailable
	case status == statusInternalDependency:
		return errInternalDependency
	case status >= 500:
		return errInternalFailure
	}
	return errValidation
}

// writeError answers a router-made error in the shape of the path's API.
// code is a short machine-readable reason (the OpenAI code).
func writeError(w http.ResponseWriter, kind apiKind, status int, code, msg string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set(HeaderError, code)
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
		typ := sageMakerType(status)
		h.Set(HeaderErrorType, typ)
		body = sageMakerError{ErrorCode: typ, Message: msg, LowerMessage: msg}
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// Statuses that differ between the two APIs (see the table above).

// statusNotFound is an unknown endpoint or model: SageMaker answers
// ValidationError (400), OpenAI 404.
func statusNotFound(kind apiKind) int {
	if kind.openAI() {
		return http.StatusNotFound
	}
	return http.StatusBadRequest
}

// statusNotLoaded is a replica without a snapshot (etcd never reached).
func statusNotLoaded(kind apiKind) int {
	if kind.openAI() {
		return http.StatusServiceUnavailable
	}
	return statusInternalDependency
}

// statusModelNotReady is a model whose instances are all draining.
func statusModelNotReady(kind apiKind) int {
	if kind.openAI() {
		return http.StatusServiceUnavailable
	}
	return http.StatusTooManyRequests
}

// upstreamFailureStatus is the status when no candidate produced a response:
// unreachable (every try failed to connect) is SageMaker's
// InternalDependencyException, no answer its ModelError; OpenAI paths answer
// 502, which OpenAI clients retry.
func upstreamFailureStatus(kind apiKind, unreachable bool) int {
	switch {
	case kind.openAI():
		return http.StatusBadGateway
	case unreachable:
		return statusInternalDependency
	}
	return http.StatusFailedDependency
}
