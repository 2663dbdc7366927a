// Package needcgo stops a build without cgo with a message that says what
// to do. caddy-kvrouter follows KV-cache events over ZMQ through
// github.com/pebbe/zmq4, a cgo binding of libzmq; with cgo off (xcaddy's
// default, and Go's whenever no C compiler is found) that package compiles
// to nothing and the build fails with "undefined: Socket", which tells the
// builder nothing useful. Packages that need libzmq import this one for its
// side effect:
//
//	import _ "github.com/kvrouter/caddy-kvrouter/internal/needcgo"
//
// With cgo on it is empty. With cgo off, needcgo.go fails to compile, and
// the compiler's error quotes the instruction.
package needcgo
