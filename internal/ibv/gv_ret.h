// gv_ret turns a post verb's return into an errno value. Most providers
// return the errno value itself; some return -1 and leave the cause in
// errno (siw's doorbell is a write(2) to the command descriptor, which
// fails with ENOTCONN once the QP has left RTS), which read as -1 would
// pass for EPERM. The caller clears errno before the post.
#include <errno.h>

static inline int gv_ret(int r) {
	if (r == -1 && errno != 0)
		return errno;
	return r < 0 ? -r : r;
}
