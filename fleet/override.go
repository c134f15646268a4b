package fleet

// Override is one routing setting a replica's operator gave (a `serve` flag)
// that an endpoint's stored routing config replaces: a stored config is the
// endpoint's whole config, fleet-wide, so that every replica routes alike
// (docs/operations.md, "Settings etcd overrides").
type Override struct {
	// Flag is the setting's flag without dashes: "hot-key-replication".
	Flag string
	// Given is the value the operator gave this replica.
	Given string
	// Stored is the value the endpoint's stored config puts in its place.
	Stored string
}
