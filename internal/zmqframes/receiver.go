// Package zmqframes receives ZMQ messages whole, with one cgo call each,
// into a buffer it reuses, and keeps the process id that libzmq's fork
// checks ask for (getpid.go). It is its own package because cgo and Go
// assembly cannot share one, and the indexer has kernels in assembly.
package zmqframes

/*
#cgo !windows pkg-config: libzmq
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

// The frames a message keeps: a live message has three, a fourth says
// there were more (the message is malformed, its frames are dropped).
#define KVR_FRAMES 3

// kvr_receiver holds the frames of one message between a kvr_recv that
// found them too large for the caller's buffer and the kvr_take that
// copies them into a larger one.
typedef struct {
	zmq_msg_t part[KVR_FRAMES];
	int pending; // frames held in part
} kvr_receiver;

static void kvr_close(kvr_receiver *r) {
	for (int i = 0; i < r->pending; i++) {
		zmq_msg_close(&r->part[i]);
	}
	r->pending = 0;
}

// kvr_take copies the held frames into buf, one after another, and
// releases them.
static void kvr_take(kvr_receiver *r, char *buf) {
	for (int i = 0; i < r->pending; i++) {
		size_t n = zmq_msg_size(&r->part[i]);
		if (n > 0) {
			memcpy(buf, zmq_msg_data(&r->part[i]), n);
		}
		buf += n;
	}
	kvr_close(r);
}

// kvr_recv receives every frame of one message from sock: the first with
// flags, the rest (which libzmq delivers with the first, whole) at once.
// It returns how many frames the message had, their sizes (of the first
// KVR_FRAMES) in sizes and their sum in *total, and copies them into buf
// when they fit in cap bytes; otherwise it holds them for kvr_take. On
// an error it returns -1 with libzmq's errno in *err and holds nothing.
static int kvr_recv(kvr_receiver *r, void *sock, int flags, char *buf, size_t cap,
		size_t *sizes, size_t *total, int *err) {
	int n = 0;
	*total = 0;
	for (;;) {
		zmq_msg_t spare;
		zmq_msg_t *m = n < KVR_FRAMES ? &r->part[n] : &spare;
		zmq_msg_init(m);
		int rc;
		for (;;) {
			rc = zmq_msg_recv(m, sock, n == 0 ? flags : 0);
			// Only a wait for the first frame may give up: the rest of a
			// begun message is there, and an interrupted read of it is
			// retried rather than losing the message's tail.
			if (rc >= 0 || n == 0 || zmq_errno() != EINTR) {
				break;
			}
		}
		if (rc < 0) {
			*err = zmq_errno();
			zmq_msg_close(m);
			kvr_close(r);
			return -1;
		}
		int more = zmq_msg_more(m);
		if (n < KVR_FRAMES) {
			sizes[n] = (size_t)rc;
			*total += (size_t)rc;
			r->pending = n + 1;
		} else {
			zmq_msg_close(m);
		}
		n++;
		if (!more) {
			break;
		}
	}
	if (*total <= cap) {
		kvr_take(r, buf);
	}
	return n;
}
*/
import "C"

import (
	"reflect"
	"unsafe"

	zmq "github.com/pebbe/zmq4"
)

// Receiver receives a socket's messages with one cgo call each, into a
// buffer it reuses. pebbe/zmq4's RecvMessageBytes makes six cgo calls
// per frame (init, receive, data, copy, close, and a getsockopt for "more")
// and allocates every frame and grows the frame list: 18 calls and six
// allocations for a live message, several times what decoding a small
// payload costs, in front of a 1,024-worker fleet sending tens of
// thousands of them a second. Frames returned are valid until the next
// receive.
type Receiver struct {
	sub    *zmq.Socket
	sock   unsafe.Pointer // libzmq's socket behind sub; nil: use sub's own receive
	c      *C.kvr_receiver
	buf    []byte
	sizes  [C.KVR_FRAMES]C.size_t
	frames [C.KVR_FRAMES + 1][]byte
}

// Buffer sizes: a receiver starts small (a fleet has a thousand of them)
// and keeps what most payloads need; one that grew past frameBufKeep for
// a large message gives the memory back after it.
const (
	frameBufInitial = 4 << 10
	frameBufKeep    = 64 << 10
)

// New returns a Receiver of s, which must outlive it (Close it first).
// Only one goroutine may use them, as for any ZMQ socket.
func New(s *zmq.Socket) *Receiver {
	r := &Receiver{sub: s, sock: socketHandle(s)}
	if r.sock != nil {
		r.c = (*C.kvr_receiver)(C.calloc(1, C.sizeof_kvr_receiver))
		r.buf = make([]byte, frameBufInitial)
	}
	return r
}

// socketHandle returns the libzmq socket behind s, or nil. pebbe/zmq4
// keeps it in an unexported field and offers no accessor; reading it
// through reflection is what lets the hot receive skip the per-frame
// calls. A zmq4 that renames the field gets nil here, and the receiver
// falls back to zmq4's own receive (TestSocketHandle fails so the
// fallback is noticed).
func socketHandle(s *zmq.Socket) unsafe.Pointer {
	f := reflect.ValueOf(s).Elem().FieldByName("soc")
	if !f.IsValid() || f.Kind() != reflect.UnsafePointer {
		return nil
	}
	return *(*unsafe.Pointer)(unsafe.Pointer(f.UnsafeAddr()))
}

// Recv receives one whole message: its frames, at most KVR_FRAMES of them
// followed by a nil one when the message had more (which no well-framed
// message has). Errors are zmq4's Errno values, so callers compare them
// as they do zmq4's.
func (r *Receiver) Recv(flags zmq.Flag) ([][]byte, error) {
	if r.sock == nil {
		return r.sub.RecvMessageBytes(flags)
	}
	var total C.size_t
	var errno C.int
	n := int(C.kvr_recv(r.c, r.sock, C.int(flags), (*C.char)(unsafe.Pointer(&r.buf[0])), C.size_t(len(r.buf)),
		&r.sizes[0], &total, &errno))
	if n < 0 {
		return nil, zmq.Errno(errno)
	}
	if int(total) > len(r.buf) {
		// Bounded by the socket's ZMQ_MAXMSGSIZE per frame: libzmq has
		// already refused a larger one.
		r.buf = make([]byte, int(total))
		C.kvr_take(r.c, (*C.char)(unsafe.Pointer(&r.buf[0])))
	}
	kept := min(n, C.KVR_FRAMES)
	off := 0
	for i := range kept {
		size := int(r.sizes[i])
		r.frames[i] = r.buf[off : off+size : off+size]
		off += size
	}
	if n > kept {
		r.frames[kept] = nil
		kept++
	}
	return r.frames[:kept], nil
}

// Release drops a buffer a large message grew, and the frames that point
// into it (else they keep it alive); the frames Recv returned last must
// no longer be in use.
func (r *Receiver) Release() {
	if len(r.buf) > frameBufKeep {
		r.buf = make([]byte, frameBufInitial)
		r.frames = [C.KVR_FRAMES + 1][]byte{}
	}
}

// Close releases what the receiver holds; the socket is not touched.
func (r *Receiver) Close() {
	if r.c != nil {
		C.kvr_close(r.c)
		C.free(unsafe.Pointer(r.c))
		r.c = nil
	}
}
