#include "ps_trace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "ps_error.h"

struct ps_trace {
    FILE *f;
    int pid;
    pthread_mutex_t mu;
};

int ps_trace_open(const char *path, int pid, const char *process_name, ps_trace **out)
{
    *out = NULL;
    ps_trace *t = calloc(1, sizeof *t);
    if (!t)
        return PS_ENOMEM;
    t->f = fopen(path, "w");
    if (!t->f) {
        free(t);
        return PS_EIO;
    }
    t->pid = pid;
    pthread_mutex_init(&t->mu, NULL);
    fprintf(t->f,
            "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"name\":\"%s\"}}",
            pid, process_name);
    *out = t;
    return 0;
}

void ps_trace_thread_name(ps_trace *t, int tid, const char *name)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    fprintf(t->f,
            ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"name\":\"%s\"}}",
            t->pid, tid, name);
    pthread_mutex_unlock(&t->mu);
}

void ps_trace_event(ps_trace *t, const char *name, const char *cat, int tid, int64_t start_ns,
                    int64_t end_ns, int64_t step, int layer)
{
    if (!t)
        return;
    char args[96] = "";
    if (step >= 0 && layer >= 0)
        snprintf(args, sizeof args, ",\"args\":{\"step\":%lld,\"layer\":%d}", (long long)step,
                 layer);
    else if (step >= 0)
        snprintf(args, sizeof args, ",\"args\":{\"step\":%lld}", (long long)step);
    else if (layer >= 0)
        snprintf(args, sizeof args, ",\"args\":{\"layer\":%d}", layer);
    pthread_mutex_lock(&t->mu);
    fprintf(t->f,
            ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
            "\"ts\":%.3f,\"dur\":%.3f%s}",
            name, cat, t->pid, tid, (double)start_ns / 1e3,
            (double)(end_ns - start_ns) / 1e3, args);
    pthread_mutex_unlock(&t->mu);
}

int ps_trace_close(ps_trace *t)
{
    if (!t)
        return 0;
    fprintf(t->f, "\n]}\n");
    int rc = fclose(t->f) == 0 ? 0 : PS_EIO;
    pthread_mutex_destroy(&t->mu);
    free(t);
    return rc;
}
