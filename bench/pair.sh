# Sourced by bench/ceiling.sh and bench/clients.sh: one measurement by a C peer's server and
# client on this host.
#
# pair_run OUT EXPECT SERVER-CMD... -- CLIENT-CMD...: starts the server in the background, runs
# the client with its output (stdout and stderr) in OUT, and tries the client again, up to 5
# times while the server lives, unless it exited 0 with a line matching EXPECT (an extended
# regular expression) in OUT: a client that finds no server listening yet fails, and some
# (cmtime) exit 0 all the same. A server that does not end with its client is killed.
pair_run() {
	local out=$1 expect=$2 srv=() srvpid
	shift 2
	while [[ $1 != -- ]]; do srv+=("$1"); shift; done
	shift
	"${srv[@]}" >/dev/null 2>&1 &
	srvpid=$!
	sleep 1
	for _ in 1 2 3 4 5; do
		"$@" >"$out" 2>&1 && grep -qE "$expect" "$out" && break
		kill -0 "$srvpid" 2>/dev/null || break
		sleep 1
	done
	for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$srvpid" 2>/dev/null || break; sleep 0.5; done
	kill "$srvpid" 2>/dev/null
	wait "$srvpid" 2>/dev/null
}
