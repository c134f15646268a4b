// Package codeshape checks the shape of the repository's code, as its tests:
// limits that review asked for and that nothing else would keep (issue 18:
// no function outside tests and internal/ longer than 120 lines).
package codeshape
