/* What move.c (a source's, a destination's and a removed server's side)
 * and move_coord.c (server 0's) share.  I/O thread only. */
#ifndef PS_MOVE_INTERNAL_H
#define PS_MOVE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "move.h"
#include "move_link.h"
#include "ps_smap.h"

/* An object on the wire (MOVEPLAN's and MOVE's lists, 32 bytes: u32 kind,
 * i32 slot, u64 key, u32 a, u32 b, i32 home, u32 0): its id, a slot (c=2:
 * where it comes from; else unused) and its home (a chunk's default owner:
 * common/ps_placement.c's server; a partition's is a). */
#define MOVE_OBJ_BYTES 32
typedef struct mv_obj {
    uint32_t kind; /* PS_SMAP_CHUNK, PS_SMAP_PART */
    uint64_t key;
    uint32_t a, b; /* chunk: index, 0; partition: home, index */
    int32_t slot;
    int32_t home;
} mv_obj;

/* MOVEPLAN's `c` */
enum {
    MOVE_PLAN_CLAIM = 1,  /* an added server: you are slot `sl`, at `to` */
    MOVE_PLAN_EXPECT = 2, /* the objects of frame 1 are coming here */
    MOVE_PLAN_GIVE = 3,   /* send the objects of frame 1 to slot `sl` at `to` */
    MOVE_PLAN_LEFT = 4,   /* you are removed */
    MOVE_PLAN_CANCEL = 5  /* the objects of frame 1 are not coming after all */
};

/* Build and hand the update threads' commands (move.c). */
void move_send_take(ps_server *s, int thread, const mv_obj *o, size_t n, int slot,
                    const char *ep, uint64_t token);
/* records: malloc'd, the thread frees them; token 0: loaded back here. */
void move_send_load(ps_server *s, int thread, void *records, size_t len, uint64_t token);

/* One object of an inventory (OBJECTS' reply, 40 bytes): kind as
 * PS_SMAP_* (= PS_MOVE_*), a chunk's home the slot whose INIT made it. */
#define MOVE_INV_BYTES 40
typedef ps_upd_obj ps_move_inv;

/* Object -> slot. */
#define MOVE_NONE (-2)
typedef struct move_ent {
    mv_obj o;
    int slot;
    int used;
} move_ent;
typedef struct move_tab {
    move_ent *e;
    size_t cap, n;
} move_tab;
int move_tab_get(const move_tab *t, const mv_obj *o);
int move_tab_put(move_tab *t, const mv_obj *o, int slot);
void move_tab_del(move_tab *t, const mv_obj *o);
void move_tab_free(move_tab *t);

/* A source's MOVEPLAN c=3: its objects taken by their update threads in
 * groups (one per source thread and destination thread), each group's
 * records sent in one MOVE and kept until the destination loaded them. */
typedef struct give_grp {
    int thread, to_thread;
    mv_obj *objs; /* into the job's objs */
    size_t n;
    void *block;       /* the records PS_OUT_TAKEN gave (NULL until then) */
    size_t len;
    uint64_t bytes;
    int state;         /* 0 taking, 1 sent, 2 loaded there, 3 failed (loaded back here) */
} give_grp;

#define MOVE_MAX_GIVES 8
typedef struct give_job {
    int active;
    zmq_msg_t id;
    int have_id;
    ps_header req;
    int slot_to, to_threads;
    char to_ep[PS_ENDPOINT_MAX];
    mv_obj *objs;
    size_t nobjs;
    give_grp *grp;
    int ngroups, left;
    int rc;
    char why[512];
    uint64_t bytes;
    int64_t t0, t_taken;
} give_job;

/* A finished give's memory (its route frame too), the slot cleared. */
void move_give_free(give_job *g);

/* A destination's MOVE: loading on update thread `thread`. */
#define MOVE_MAX_LOADS 16
typedef struct load_job {
    int active;
    zmq_msg_t id;
    int have_id;
    ps_header req;
    mv_obj *objs;
    size_t n;
    int from_slot;
    uint64_t bytes;
    int64_t t0;
} load_job;

/* OBJECTS: the update threads' lists, gathered. */
typedef struct inv_job {
    int active, left, rc;
    zmq_msg_t id;
    int have_id;
    ps_header req;
    unsigned char *buf;
    size_t len;
} inv_job;

struct move_coord;

struct ps_move {
    ps_server *s;
    ps_links *links;
    char self_ep[PS_ENDPOINT_MAX]; /* this server's, as the job names it (c=1, c=3) */
    move_tab gone;     /* objects given away: the slot that holds them */
    move_tab incoming; /* objects on their way here: the slot they come from */
    move_tab homes;    /* chunks here away from home: their home slot */
    int claimed;       /* an added server the coordinator made a slot */
    char (*slot_ep)[PS_ENDPOINT_MAX];
    int nslots;
    int left;          /* removed: everything is answered PS_EMOVED without a slot */
    int64_t left_ns, left_heard_ns;
    give_job give[MOVE_MAX_GIVES];
    load_job load[MOVE_MAX_LOADS];
    inv_job inv;
    struct move_coord *coord; /* server 0: the change in progress and the map */
    uint64_t redirects, out_objects, in_objects;
    uint64_t next_token;
};

int move_slot_set(ps_move *m, int slot, const char *ep);
const char *move_slot_ep(const ps_move *m, int slot);

int move_objs_parse(const void *p, size_t len, size_t skip, mv_obj **out, size_t *n,
                    char *why, size_t why_len);
void move_objs_write(void *p, const mv_obj *o, size_t n);
void move_inv_write(void *p, const ps_move_inv *v, size_t n);
int move_inv_parse(const void *p, size_t len, ps_move_inv **out, size_t *n, char *why,
                   size_t why_len);
int move_owner_thread(int rank, int T, const mv_obj *o);

/* The links' replies: tags with MOVE_TAG_COORD go to the coordinator. */
#define MOVE_TAG_COORD (1ull << 63)
void move_link_done(void *user, uint64_t tag, const ps_header *h, zmq_msg_t *payload, int rc,
                    const char *why);

/* move_coord.c */
void move_coord_reply(ps_move *m, uint64_t tag, const ps_header *h, zmq_msg_t *payload, int rc,
                      const char *why);
void move_coord_free(ps_move *m);
uint64_t move_coord_epoch(const ps_move *m);
/* Server 0: the slot the map says holds o when that is not `self` (a
 * request for an object of a server that left comes here), with its
 * endpoint known; else MOVE_NONE. */
int move_coord_owner(ps_move *m, const mv_obj *o, int self);

#endif
