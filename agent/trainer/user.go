package trainer

import (
	"errors"
	"fmt"
	"math"
	"os/user"
	"strconv"
	"strings"
)

// ParseUser reads a trainer.user value into the user ID of Finder.User:
//   - "" (or only spaces): nil, any user;
//   - a decimal number: that uid, whether or not it has a name here (a container's user may
//     not);
//   - anything else: a user name, looked up here (os/user: /etc/passwd, or NSS with cgo).
//
// It returns an error for a name that is not known here and for a number out of the range of
// user IDs.
func ParseUser(v string) (*int, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, nil
	}
	if strings.Trim(v, "0123456789") == "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == math.MaxUint32 { // (uid_t)-1 is "no user"
			return nil, fmt.Errorf("uid %s out of range", v)
		}
		uid := int(n)
		return &uid, nil
	}
	u, err := user.Lookup(v)
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		return nil, fmt.Errorf("no user %q here: want a user name or a numeric uid", v)
	}
	if err != nil {
		return nil, fmt.Errorf("look up user %q: %w", v, err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, fmt.Errorf("user %q has uid %q, not a number", v, u.Uid)
	}
	return &uid, nil
}
