/* tcp.h - setup of the TCP transport: listen, exchange addresses (through the
 * store or the parent communicator), then connect the full mesh. */
#ifndef KT_TCP_H
#define KT_TCP_H

#include "group.h"

#define KT_TCP_TOKEN_BYTES 16 /* 128 bits */

/* What a rank publishes so that peers can connect to it. Fixed size, plain
 * data, so it can travel through the store or an allgather. */
typedef struct kt__tcp_addr {
  char ip[48];
  int32_t port;
  int32_t pid;
  int32_t lanes; /* its KAITIAN_NSOCKS */
  char host[64];
  char hostid[104]; /* hostname/boot id: ranks with equal ids share a host */
  uint64_t shm_owed; /* kt__shm_owed() when it was made (set by the caller) */
  /* Random (getrandom), drawn by kt__tcp_listen. Rank 0's becomes the
   * communicator's hello token: every connection of the mesh must present
   * it. It travels only through the store (which only holders of the job
   * secret read) or the parent communicator's own connections (a split). */
  uint8_t token[KT_TCP_TOKEN_BYTES];
} kt__tcp_addr;

/* Open a listening socket on the chosen interface and describe it in *me
 * (with the data connections per peer it offers a communicator of up to size
 * ranks: KAITIAN_NSOCKS / share, at least one); rank is for messages only. */
KT_INTERNAL kt_result kt__tcp_listen(int rank, int size, int share, kt__tcp_addr *me, int *listen_fd);
/* Allocate c->tcp for c->size ranks (c->prefix set); takes listen_fd. On
 * failure listen_fd is closed. */
KT_INTERNAL kt_result kt__tcp_create(kt__group *c, int listen_fd);
/* KAITIAN_NSOCKS, checked: data connections per pair of ranks on two hosts. */
KT_INTERNAL int kt__tcp_lanes_param(void);
/* Connect to every peer given everyone's address (all[0].token is the
 * communicator's hello token); fills c->peer_host/pid. A connection that
 * does not present the token, claims a rank out of place or a lane already
 * connected is closed and logged at WARN with its address; the mesh goes on. */
KT_INTERNAL kt_result kt__tcp_mesh(kt__group *c, const kt__tcp_addr *all);

#endif /* KT_TCP_H */
