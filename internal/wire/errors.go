package wire

import (
	"errors"
	"fmt"
)

// ErrMalformed is what every error of this package's parsers wraps: the
// bytes are not what a peer speaking this version of the protocol sends.
var ErrMalformed = errors.New("malformed protocol data")

// malformedError says what was wrong with the bytes; its text is the
// detail alone, for the caller to put in its own error.
type malformedError string

func (e malformedError) Error() string { return string(e) }
func (e malformedError) Unwrap() error { return ErrMalformed }

func malformed(format string, args ...any) error {
	return malformedError(fmt.Sprintf(format, args...))
}
