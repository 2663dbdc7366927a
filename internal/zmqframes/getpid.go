package zmqframes

/*
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

// libzmq as Debian builds it checks that the process has not forked each
// time it looks at a socket's command mailbox: a getpid system call, two
// or three a message for the gateway's receiving side and one for its I/O
// thread. A process's id does not change, so the first answer is kept.
// The executable's getpid comes before libc's for every shared library
// that calls it (ELF symbol interposition), which is how libzmq's calls
// reach this one; glibc's own internal calls and Go's runtime (which
// makes its system calls itself) are not affected.
//
// A fork that goes on without exec (which Go never does; C code might)
// forgets the kept id in the child, through pthread_atfork, so the child
// asks the kernel again: libzmq's check keeps working there. Until that
// handler is in place (the package's init), nothing is kept.
static pid_t kvr_pid;
static int kvr_keeping;

static void kvr_forget_pid(void) { __atomic_store_n(&kvr_pid, 0, __ATOMIC_RELAXED); }

pid_t getpid(void) {
	if (!__atomic_load_n(&kvr_keeping, __ATOMIC_ACQUIRE)) {
		return (pid_t)syscall(SYS_getpid);
	}
	pid_t p = __atomic_load_n(&kvr_pid, __ATOMIC_RELAXED);
	if (p == 0) {
		p = (pid_t)syscall(SYS_getpid);
		__atomic_store_n(&kvr_pid, p, __ATOMIC_RELAXED);
	}
	return p;
}

// kvr_keep_pid starts keeping the id once the fork handler is in place.
static void kvr_keep_pid(void) {
	if (pthread_atfork(NULL, NULL, kvr_forget_pid) == 0) {
		__atomic_store_n(&kvr_keeping, 1, __ATOMIC_RELEASE);
	}
}

// kvr_forked_pid_ok forks a child that reports whether getpid there
// answers the child's id (not the parent's kept one): 1 if it did, 0 if
// not, -1 if the fork or the wait failed. The child calls only getpid,
// syscall and _exit, which are safe after a multi-threaded process forks.
static int kvr_forked_pid_ok(void) {
	pid_t parent = getpid();
	pid_t child = fork();
	if (child < 0) {
		return -1;
	}
	if (child == 0) {
		pid_t self = getpid();
		_exit(self == (pid_t)syscall(SYS_getpid) && self != parent ? 0 : 1);
	}
	int status;
	if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) {
		return -1;
	}
	return WEXITSTATUS(status) == 0;
}
*/
import "C"

import "errors"

func init() { C.kvr_keep_pid() }

// processID is getpid as libzmq sees it.
func processID() int { return int(C.getpid()) }

// forkedChildSeesItsOwnID forks and reports whether getpid in the child
// answers the child's id rather than the parent's kept one. For tests.
func forkedChildSeesItsOwnID() (bool, error) {
	switch C.kvr_forked_pid_ok() {
	case 1:
		return true, nil
	case 0:
		return false, nil
	}
	return false, errors.New("fork or wait failed")
}
