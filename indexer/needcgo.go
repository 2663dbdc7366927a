package indexer

// The ZMQ listeners need cgo and libzmq; a build with cgo off fails here
// with a message that says so (package needcgo), whichever of the module's
// packages a builder imports.
import _ "github.com/kvrouter/caddy-kvrouter/internal/needcgo"
