#include "ps_endpoint.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "ps_error.h"

static int port_ok(const char *p, int bind)
{
    if (bind && strcmp(p, "*") == 0)
        return 1;
    if (!*p || strlen(p) > 5)
        return 0;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9')
            return 0;
    long v = strtol(p, NULL, 10);
    return v <= 65535 && (v > 0 || bind);
}

/* Resolve a host name to a numeric address for a bind. */
static int resolve(const char *host, char *addr, size_t cap, char *why, size_t why_len)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_ADDRCONFIG;
    int e = getaddrinfo(host, NULL, &hints, &res);
    if (e != 0 || !res) {
        ps_errorf(why, why_len, "cannot resolve '%s' to an address to bind: %s (bind to an "
            "address, e.g. tcp://127.0.0.1:PORT, or to all of them with tcp://*:PORT)", host,
            gai_strerror(e));
        return PS_EINVAL;
    }
    /* prefer IPv4: ZeroMQ sockets are IPv4-only unless ZMQ_IPV6 is set */
    struct addrinfo *pick = res;
    for (struct addrinfo *a = res; a; a = a->ai_next)
        if (a->ai_family == AF_INET) {
            pick = a;
            break;
        }
    char num[INET6_ADDRSTRLEN] = "";
    const void *src = pick->ai_family == AF_INET
                          ? (const void *)&((struct sockaddr_in *)pick->ai_addr)->sin_addr
                          : (const void *)&((struct sockaddr_in6 *)pick->ai_addr)->sin6_addr;
    inet_ntop(pick->ai_family, src, num, sizeof num);
    snprintf(addr, cap, pick->ai_family == AF_INET6 ? "[%s]" : "%s", num);
    freeaddrinfo(res);
    return 0;
}

int ps_endpoint_check(const char *ep, int bind, char *out, size_t cap, char *why,
                      size_t why_len)
{
    const char *example = bind ? "tcp://*:5555, tcp://127.0.0.1:5555 or ipc:///tmp/ps0"
                               : "tcp://127.0.0.1:5555 or tcp://host:5555";
    if (!ep || !*ep) {
        ps_errorf(why, why_len, "an empty endpoint: write tcp://HOST:PORT, e.g. %s", example);
        return PS_EINVAL;
    }
    if (strlen(ep) >= PS_ENDPOINT_MAX || strlen(ep) >= cap) {
        ps_errorf(why, why_len, "endpoint '%.40s...' is longer than %d characters", ep,
            PS_ENDPOINT_MAX - 1);
        return PS_EINVAL;
    }
    if (strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0) {
        if (!ep[strncmp(ep, "ipc://", 6) == 0 ? 6 : 9]) {
            ps_errorf(why, why_len, "endpoint '%s' names no path", ep);
            return PS_EINVAL;
        }
        snprintf(out, cap, "%s", ep);
        return 0;
    }
    if (strncmp(ep, "tcp://", 6) != 0) {
        const char *scheme = strstr(ep, "://");
        if (scheme)
            ps_errorf(why, why_len, "endpoint '%s': transport '%.*s' is not supported; write "
                "tcp://HOST:PORT or ipc://PATH, e.g. %s", ep, (int)(scheme - ep), ep, example);
        else
            ps_errorf(why, why_len, "'%s' is not an endpoint: write tcp://HOST:PORT, e.g. "
                "tcp://%s", ep, strchr(ep, ':') ? ep : "127.0.0.1:5555");
        return PS_EINVAL;
    }
    const char *hp = ep + 6, *colon = strrchr(hp, ':');
    const char *close = strchr(hp, ']');
    if (!colon || colon == hp || (close && colon < close)) {
        ps_errorf(why, why_len, "endpoint '%s' has no port: write tcp://HOST:PORT, e.g. %s", ep,
            example);
        return PS_EINVAL;
    }
    if (!port_ok(colon + 1, bind)) {
        ps_errorf(why, why_len, "endpoint '%s': port '%s' must be a number in [%d, 65535]%s",
            ep, colon + 1, bind ? 0 : 1, bind ? " or *" : "");
        return PS_EINVAL;
    }
    char host[PS_ENDPOINT_MAX];
    snprintf(host, sizeof host, "%.*s", (int)(colon - hp), hp);
    if (!bind || strcmp(host, "*") == 0 || host[0] == '[') {
        snprintf(out, cap, "%s", ep);
        return 0;
    }
    /* a bind: an address or an interface name is ZeroMQ's; a host name we resolve */
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) == 1 || if_nametoindex(host) != 0) {
        snprintf(out, cap, "%s", ep);
        return 0;
    }
    char addr[INET6_ADDRSTRLEN + 2];
    int rc = resolve(host, addr, sizeof addr, why, why_len);
    if (rc)
        return rc;
    snprintf(out, cap, "tcp://%s:%s", addr, colon + 1);
    return 0;
}
