// Package adminpb holds the Go code generated from proto/prefixrouter/admin/v1/admin.proto by admin/gen.sh.
package adminpb
