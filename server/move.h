/* Objects that move between servers while training goes on: the I/O
 * thread's side (docs/DESIGN.md "Servers added and removed").
 *
 * A job's movable objects are its dense chunks (key, chunk) and its table
 * partitions (table, home server, partition); common/ps_smap.h names them
 * and keeps the map of which server slot holds each.  Server 0 is the
 * coordinator: an admin's SERVERS request (ps_servers add / remove) makes it
 *
 *   coordinator (server 0)               each server's I/O thread
 *   HELLO, MOVEPLAN c=1 sl ------------> an added server: you are slot sl
 *   OBJECTS ---------------------------> what every update thread holds,
 *                                        with its bytes (PS_CMD_OBJECTS)
 *   plan: ps_smap_plan_add / _remove
 *   MOVEPLAN c=2 [objects] ------------> destination: they are coming;
 *                                        asked for one meanwhile it answers
 *                                        PS_EMOVED naming itself (ask again)
 *   MOVEPLAN c=3 [objects] sl to ------> source: PS_CMD_TAKE on the owning
 *                                        threads (sync: where no round of
 *                                        the thread holds a push), which
 *                                        answer what waited on them with
 *                                        PS_EMOVED; a request for one from
 *                                        now on is answered PS_EMOVED
 *                                        naming sl and to
 *                                        MOVE [records] --> destination:
 *                                        PS_CMD_LOAD_MOVED, then the reply
 *   <----------------------------------- MOVEPLAN's reply once loaded
 *   the map's new epoch (logged), the SERVERS reply
 *   MOVEPLAN c=4 ----------------------> a removed server: everything it is
 *                                        asked from now on is answered
 *                                        PS_EMOVED without a slot (it left)
 *                                        and it exits once nobody asks
 *
 * A source whose MOVE fails (the destination does not answer within
 * PS_MOVE_TIMEOUT_MS, or refuses) loads the records back into its own
 * threads: an object is always on exactly one server, never lost.
 *
 * One change at a time.  Not with replicas (--group), checkpoints
 * (--checkpoint-dir: the files do not say where moved objects went) or an
 * elastic job's workers (--num-workers MIN:MAX): the SERVERS request is
 * refused naming the reason.
 *
 * Everything here runs on the I/O thread. */
#ifndef PS_MOVE_H
#define PS_MOVE_H

#include <stdint.h>
#include <zmq.h>

#include "ps_proto.h"
#include "updater_frames.h"

typedef struct ps_server ps_server;
typedef struct ps_move ps_move;

/* How long a move of objects may take before it counts as failed, and
 * how long a server may take to answer any other step. */
#define PS_MOVE_TIMEOUT_MS 60000
#define PS_MOVE_ASK_MS 10000
/* A removed server exits once no worker asked it anything for this long
 * (each was told it left), or this much later at most. */
#define PS_MOVE_LEFT_QUIET_MS 3000
#define PS_MOVE_LEFT_MAX_MS 60000
/* Poll items the moves add to the I/O loop at most. */
#define PS_MOVE_MAX_POLL 64

int ps_move_open(ps_server *s, ps_move **out);
void ps_move_close(ps_move *m);

/* A request for an object that is not here: answered PS_EMOVED (naming
 * where it is, itself when it is on its way here, or nothing when this
 * server left the job), 1; else 0 (handle it).  Cheap when nothing ever
 * moved. */
int ps_move_redirect(ps_server *s, zmq_msg_t *id, const ps_header *h);

/* The loop: sockets to poll, what came on them, when to wake. */
void ps_move_poll_items(ps_move *m, zmq_pollitem_t *it, int *n);
void ps_move_dispatch(ps_server *s, const zmq_pollitem_t *it, int first, int64_t now);
long ps_move_timeout_ms(const ps_move *m, int64_t now);
/* A removed server that told everyone: time to exit (the loop stops). */
int ps_move_left_done(const ps_move *m, int64_t now);

/* The messages (their rows of proto/ps_msg_table.h). */
void ps_move_on_servers(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h);
void ps_move_on_objects(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h);
void ps_move_on_moveplan(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h);
void ps_move_on_move(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h);

/* What update thread i answered: PS_OUT_TAKEN, PS_OUT_MOVED_IN,
 * PS_OUT_OBJECTS (their frames; the blocks and lists in them are ours). */
void ps_move_taken(ps_server *s, int i, ps_move_frame *tf);
void ps_move_loaded(ps_server *s, int i, ps_move_frame *lf);
void ps_move_objects(ps_server *s, int i, ps_objects_frame *of);

/* Did any object ever move to or from this server (or is it an added or a
 * removed one)?  An export's snapshot is refused then. */
int ps_move_happened(const ps_move *m);

/* For the stats and logs: objects given away and taken in so far, and
 * the map's epoch (server 0). */
void ps_move_figures(const ps_move *m, uint64_t *out_objects, uint64_t *in_objects,
                     uint64_t *epoch);

#endif
