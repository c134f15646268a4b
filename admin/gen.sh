#!/bin/sh
# Regenerates admin/adminpb from proto/ (CI does not run protoc: commit the
# output). Needs protoc (apt-get install protobuf-compiler) and the generators
# pinned to go.mod's protobuf version:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
set -eu
cd "$(dirname "$0")/.."
PATH="$(go env GOPATH)/bin:$PATH"
protoc -I proto \
	--go_out=. --go_opt=module=github.com/prefixrouter/prefixrouter \
	--go-grpc_out=. --go-grpc_opt=module=github.com/prefixrouter/prefixrouter \
	proto/prefixrouter/admin/v1/admin.proto
