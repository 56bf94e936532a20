/* p2p_shm.c - send, recv and sendrecv between ranks of one host: each message
 * (a header with tag, length and type, then the payload) streams through the
 * ring of its ordered pair in the communicator's segment (kt__shm_p2p in
 * shm.c), the sender filling while the receiver drains; sendrecv moves both
 * directions at once. Matched in issue order per pair, as over TCP. One copy
 * in, one copy out. */
#include "coll.h"

#include "transport/shm.h"

kt_result kt__p2p_shm(kt__exec *ex) { return kt__p2p_run(ex, kt__shm_p2p); }
