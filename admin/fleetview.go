package admin

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prefixrouter/prefixrouter/admin/adminpb"
)

// WriteFleet writes a GetFleet answer for people: one line about the
// snapshot, then a table with one row per instance (endpoint, id, address,
// draining, healthy, in flight, external load, breaker). State columns read
// "-" when the replica reported no state for the instance, and an unknown
// external load reads "unknown". Below the table, one line per setting given
// to the replica that an endpoint's stored routing config replaces.
func WriteFleet(w io.Writer, resp *adminpb.GetFleetResponse) error {
	fmt.Fprintf(w, "revision=%d replicas=%d snapshot_age=%s\n", resp.GetRevision(), resp.GetReplicas(), resp.GetAge().AsDuration().Round(time.Millisecond))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tID\tADDR\tDRAINING\tHEALTHY\tIN_FLIGHT\tEXTERNAL_LOAD\tBREAKER")
	for _, ep := range resp.GetEndpoints() {
		for _, in := range ep.GetInstances() {
			healthy, inFlight, external, breaker := "-", "-", "-", "-"
			if st := in.GetState(); st != nil {
				healthy = strconv.FormatBool(st.GetHealthy())
				inFlight = strconv.FormatInt(st.GetInFlight(), 10)
				external = "unknown"
				if st.GetExternalLoad() >= 0 {
					external = strconv.FormatInt(st.GetExternalLoad(), 10)
				}
				breaker = breakerName(st.GetBreaker())
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s\t%s\t%s\n", ep.GetName(), in.GetId(), in.GetAddr(), in.GetDraining(), healthy, inFlight, external, breaker)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, ep := range resp.GetEndpoints() {
		for _, o := range ep.GetOverridden() {
			if _, err := fmt.Fprintf(w, "overridden: endpoint %s runs %s=%s from its stored routing config, not --%s=%s given to this replica\n",
				ep.GetName(), o.GetFlag(), o.GetStored(), o.GetFlag(), o.GetGiven()); err != nil {
				return err
			}
		}
	}
	return nil
}

// breakerName turns BREAKER_STATE_HALF_OPEN into "half-open".
func breakerName(b adminpb.BreakerState) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(b.String(), "BREAKER_STATE_")), "_", "-")
}
