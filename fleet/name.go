package fleet

import "fmt"

// MaxNameLength bounds every name a fleet keeps: endpoints, instance ids,
// router replica ids and adapter names. They become etcd key segments and
// metric labels.
const MaxNameLength = 128

// ValidateName checks a name: 1..MaxNameLength printable ASCII characters,
// no space and no '/' (a key segment). what says what the name is of, for
// the message ("endpoint name", "instance id"). The error wraps ErrInvalid.
// Every package that takes a name checks it here.
func ValidateName(what, name string) error {
	if p := nameProblem(what, name); p != "" {
		return fmt.Errorf("fleet: %w %s", ErrInvalid, p)
	}
	return nil
}

// nameProblem says what is wrong with a name, "" when nothing is.
func nameProblem(what, name string) string {
	if name == "" || len(name) > MaxNameLength {
		return fmt.Sprintf("%s: must be 1..%d characters, got %q", what, MaxNameLength, name)
	}
	for _, r := range name {
		if r <= ' ' || r > '~' || r == '/' {
			return fmt.Sprintf("%s %q: must be printable ASCII without spaces or '/'", what, name)
		}
	}
	return ""
}
