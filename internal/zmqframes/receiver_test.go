package zmqframes

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// TestSocketHandle: the libzmq socket behind a zmq4 socket is found. If a
// zmq4 upgrade hides it elsewhere, the listeners fall back to zmq4's
// receive with its per-frame calls; this test says so.
func TestSocketHandle(t *testing.T) {
	s, err := zmq.NewSocket(zmq.PULL)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if socketHandle(s) == nil {
		t.Fatal("no libzmq socket handle behind the zmq4 socket")
	}
}

// pushPull returns a PUSH socket connected over loopback TCP to a PULL
// socket that a Receiver reads.
func pushPull(t *testing.T) (*zmq.Socket, *Receiver) {
	t.Helper()
	pull, err := zmq.NewSocket(zmq.PULL)
	if err != nil {
		t.Fatal(err)
	}
	push, err := zmq.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	rx := New(pull)
	t.Cleanup(func() {
		rx.Close()
		push.SetLinger(0)
		push.Close()
		pull.Close()
	})
	if err := pull.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	at, err := pull.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	if err := push.Connect(at); err != nil {
		t.Fatal(err)
	}
	return push, rx
}

// TestFrameReceiver: messages of every shape a publisher can send (one
// frame or many, empty frames, payloads larger than the receiver's
// buffer, small ones after large ones) come out frame for frame as they
// were sent, the first KVR_FRAMES frames of a longer message followed by
// a nil frame; an empty socket reports EAGAIN as zmq4 does.
func TestFrameReceiver(t *testing.T) {
	push, rx := pushPull(t)
	_, err := rx.Recv(zmq.DONTWAIT)
	for zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
		_, err = rx.Recv(zmq.DONTWAIT) // a preemption signal interrupted it
	}
	if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
		t.Fatalf("empty socket: %v, want EAGAIN", err)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	frame := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	shapes := [][]int{
		{5, 8, 1200},
		{0, 8, 0},
		{3},
		{},
		{5, 8, frameBufInitial - 13}, // exactly fills the first buffer
		{5, 8, frameBufInitial - 12}, // one byte over
		{7, 8, 300 << 10},            // grows past what is kept
		{5, 8, 40},                   // back to the small buffer
		{1, 2, 3, 4, 5},
		{2, 2, 2 << 20, 9},
		{6, 8, 50 << 10}, // grown, and kept
		{6, 8, 10},
	}
	for round := range 3 {
		for _, sizes := range shapes {
			name := fmt.Sprintf("round %d, frames %v", round, sizes)
			var sent [][]byte
			for _, n := range sizes {
				sent = append(sent, frame(n))
			}
			if len(sent) == 0 {
				sent = [][]byte{{}} // a message has at least one frame
			}
			if _, err := push.SendMessage(sent); err != nil {
				t.Fatal(err)
			}
			got, err := recvWithin(rx, 5*time.Second)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			want := sent
			if len(sent) > 3 {
				want = append(sent[:3:3], nil)
			}
			if len(got) != len(want) {
				t.Fatalf("%s: %d frames, want %d", name, len(got), len(want))
			}
			for i := range want {
				if !bytes.Equal(got[i], want[i]) || (want[i] == nil) != (got[i] == nil) {
					t.Fatalf("%s: frame %d differs (%d bytes, want %d)", name, i, len(got[i]), len(want[i]))
				}
			}
			grown := len(rx.buf) > frameBufKeep
			rx.Release()
			if len(rx.buf) > frameBufKeep {
				t.Fatalf("%s: a %d-byte buffer kept after release", name, len(rx.buf))
			}
			for i, f := range rx.frames {
				if grown && f != nil {
					// A frame left behind keeps the dropped buffer alive.
					t.Fatalf("%s: frame %d (%d bytes) still held after the grown buffer was dropped", name, i, cap(f))
				}
			}
		}
	}
}

// recvWithin receives without blocking, retrying on EAGAIN (and EINTR:
// Go's preemption signal can interrupt libzmq's system calls) until the
// message arrives or d passes.
func recvWithin(rx *Receiver, d time.Duration) ([][]byte, error) {
	deadline := time.Now().Add(d)
	for {
		frames, err := rx.Recv(zmq.DONTWAIT)
		e := zmq.AsErrno(err)
		if e != zmq.Errno(syscall.EAGAIN) && e != zmq.Errno(syscall.EINTR) || time.Now().After(deadline) {
			return frames, err
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFrameReceiverFallback: without the libzmq handle (a zmq4 that hides
// it elsewhere), the receiver hands out zmq4's own frames, and its other
// calls are harmless.
func TestFrameReceiverFallback(t *testing.T) {
	push, rx := pushPull(t)
	rx.Close() // what New would not have allocated without a handle
	rx.sock, rx.buf = nil, nil
	sent := [][]byte{[]byte("topic"), {0, 0, 0, 0, 0, 0, 0, 1}, []byte("payload")}
	if _, err := push.SendMessage(sent); err != nil {
		t.Fatal(err)
	}
	got, err := recvWithin(rx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(sent) {
		t.Fatalf("%d frames, want %d", len(got), len(sent))
	}
	for i := range sent {
		if !bytes.Equal(got[i], sent[i]) {
			t.Fatalf("frame %d: %q, want %q", i, got[i], sent[i])
		}
	}
	rx.Release()
}
