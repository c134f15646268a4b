package main

import (
	"context"
	"encoding/json"
	"io"
	"time"

	"github.com/spf13/cobra"
)

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// contextTimeout bounds a one-shot etcd call: the dial timeout plus slack.
func contextTimeout(cmd *cobra.Command, dial time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), dial+5*time.Second)
}
