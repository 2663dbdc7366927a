package caddymodule

import "syscall"

// descriptorsPerRank is what one followed worker rank costs in file
// descriptors, rounded up: its SUB socket (libzmq's mailbox and the TCP
// connection), the duplicate the listener parks on, and the socket
// monitor that redials after libzmq drops an oversized message (two inproc
// PAIR sockets and a duplicate). A replay adds a DEALER for its duration.
const descriptorsPerRank = 8

// reservedDescriptors are kept for everything else the process holds:
// client and upstream connections, the admin listener, files.
const reservedDescriptors = 4096

// ranksForDescriptors is how many worker ranks the process's descriptor
// limit can follow with reservedDescriptors to spare, or 0 when the limit
// cannot be read. Go raises the soft limit to the hard one at start, so
// the soft limit is what the process has.
func ranksForDescriptors() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur == ^uint64(0) {
		return 0
	}
	if lim.Cur <= 2*reservedDescriptors {
		return int(lim.Cur / 2 / descriptorsPerRank)
	}
	return int((lim.Cur - reservedDescriptors) / descriptorsPerRank)
}
