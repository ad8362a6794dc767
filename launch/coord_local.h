/* --coord auto: on one host, ps_launch runs the job's own etcd (the
 * coordination service the servers of a replicated job decide failovers
 * through, coord/ps_etcd.h), on free loopback ports with its data in a
 * temporary directory, and stops it and removes that directory at the end.
 * A job over several hosts uses an etcd cluster the operator runs
 * (docs/OPERATIONS.md "Replicas"). */
#ifndef PS_LAUNCH_COORD_LOCAL_H
#define PS_LAUNCH_COORD_LOCAL_H

#include <limits.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct ps_launch_etcd {
    int auto_;          /* planned (ps_launch_etcd_plan) */
    char bin[PATH_MAX]; /* the etcd program */
    char url[64];       /* its client URL */
    char dir[PATH_MAX]; /* its data and log */
    int client_port, peer_port;
    pid_t pid;          /* running; 0: not */
} ps_launch_etcd;

/* Find etcd (on PATH, or /usr/bin/etcd) and two free loopback ports; e->url
 * is then what the servers are given.  0, or PS_ENOTFOUND (no etcd: install
 * etcd-server, or give --coord) / PS_EIO with why. */
int ps_launch_etcd_plan(ps_launch_etcd *e, char *why, size_t len);
/* Start it and wait (at most 10 s) until its client port answers.  0, or
 * PS_EIO with why (its log's path). */
int ps_launch_etcd_start(ps_launch_etcd *e, char *why, size_t len);
/* Stop it (SIGTERM, SIGKILL after 5 s) and remove its directory.  Fine on
 * one never started. */
void ps_launch_etcd_stop(ps_launch_etcd *e);

#endif
