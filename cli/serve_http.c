/* kvplan serve: the libmicrohttpd daemon (one thread per connection), the scheduler's stepping
 * thread, and the jobs that carry a request's tokens from one to the other (cli/serve.h).
 *
 * A job is shared by the scheduler (its event callback, on the stepping thread) and the HTTP
 * response (its content reader, on the connection's thread), with a reference count: the
 * scheduler's reference ends with the request's final event, the response's when libmicrohttpd
 * frees it (the body was sent, or the client went away: then the request is cancelled and its
 * blocks freed at the next step). */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "cli.h"
#include "serve.h"

typedef struct server {
    kv_sched *sched;
    const kv_tokenizer *tok;
    const kv_server_opts *o;
    pthread_mutex_t mu; /* the tokenizer's encode, the counters */
    int stopping;       /* under mu */
    uint64_t next_job;
    uint64_t http[6]; /* responses by class: 200, 400, 401, 404/405, 413, 429/503 */
} server;

typedef struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    server *srv;
    kv_serve_req req;
    kv_serve_ident ident;
    char id[48];
    uint64_t sched_id;
    char *text; /* generated text so far (stop strings cut it) */
    size_t len, cap, sent;
    char *out; /* bytes for the client not yet read */
    size_t out_len, out_cap, out_pos;
    int done, gone, role_sent, n_prompt, n_gen;
    const char *finish;
} job;

static int buf_add(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = (*len + n + 1) * 2;
        char *nb = realloc(*b, nc);
        if (!nb) return -1;
        *b = nb;
        *cap = nc;
    }
    memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = 0;
    return 0;
}

static void job_unref(job *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    kv_serve_req_free(&j->req);
    free(j->text);
    free(j->out);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static void out_event(job *j, char *ev) {
    if (ev && !j->gone) buf_add(&j->out, &j->out_len, &j->out_cap, ev, strlen(ev));
    free(ev);
}

/* Streaming: send the text that can no longer change (not inside a UTF-8 sequence, not a
 * possible start of a stop string), or everything at the end. */
static void stream_text(job *j, int final) {
    size_t upto = j->len;
    if (!final) {
        size_t hold = 0;
        for (int i = 0; i < j->req.n_stop; i++) {
            size_t sl = strlen(j->req.stop[i]);
            if (sl - 1 > hold) hold = sl - 1;
        }
        upto = upto > hold ? upto - hold : 0;
        if (upto < j->sent) upto = j->sent;
        upto = j->sent + kv_serve_utf8_complete(j->text + j->sent, upto - j->sent);
    }
    if (upto == j->sent && (j->role_sent || !j->ident.chat)) return;
    char *clean = NULL;
    const char *t = j->text + j->sent;
    size_t n = upto - j->sent;
    if (!kv_serve_utf8_valid(t, n)) { /* a byte token that made no character */
        char *tmp = strndup(t, n);
        clean = tmp ? kv_cli_clean_text(tmp, 0) : NULL;
        free(tmp);
        if (clean) {
            t = clean;
            n = strlen(clean);
        }
    }
    out_event(j, kv_serve_chunk(&j->ident, t, n, NULL, j->ident.chat && !j->role_sent, NULL));
    free(clean);
    j->role_sent = 1;
    j->sent = upto;
}

/* A stop string in the text: cut the text there and return 1. */
static int cut_stop(job *j) {
    for (int i = 0; i < j->req.n_stop; i++) {
        size_t sl = strlen(j->req.stop[i]);
        size_t from = j->len > j->sent + sl + 64 ? j->len - sl - 64 : 0;
        char *hit = strstr(j->text + from, j->req.stop[i]);
        if (hit) {
            j->len = (size_t)(hit - j->text);
            j->text[j->len] = 0;
            return 1;
        }
    }
    return 0;
}

static void final_bytes(job *j) {
    long usage[2] = {j->n_prompt, j->n_gen};
    if (j->req.stream) {
        stream_text(j, 1);
        out_event(j, kv_serve_chunk(&j->ident, NULL, 0, j->finish, 0, NULL));
        if (j->req.include_usage) out_event(j, kv_serve_chunk(&j->ident, NULL, 0, NULL, 0, usage));
        out_event(j, strdup("data: [DONE]\n\n"));
        return;
    }
    char *clean = kv_serve_utf8_valid(j->text, j->len) ? NULL : kv_cli_clean_text(j->text, 0);
    const char *t = clean ? clean : j->text;
    out_event(j, kv_serve_full(&j->ident, t ? t : "", t ? strlen(t) : 0, j->finish, usage));
    free(clean);
}

/* The scheduler's event callback (stepping thread). */
static int on_event(void *user, const kv_sched_event *ev) {
    job *j = user;
    int stop = 0;
    pthread_mutex_lock(&j->mu);
    j->n_prompt = ev->n_prompt;
    if (ev->finish == KV_FINISH_NONE && j->req.chat && ev->token == j->srv->o->eot_id) {
        stop = 1; /* the end of the assistant's turn: not part of the answer */
    } else if (ev->finish == KV_FINISH_NONE) {
        char piece[512];
        int k = kv_tokenizer_piece(j->srv->tok, ev->prev, ev->token, piece, sizeof piece);
        j->n_gen = ev->n_generated;
        if (buf_add(&j->text, &j->len, &j->cap, piece, (size_t)k)) stop = 1;
        if (j->req.n_stop && cut_stop(j)) stop = 1;
        if (j->req.stream && !stop) stream_text(j, 0);
    } else {
        j->finish = ev->finish == KV_FINISH_LENGTH ? "length" : "stop";
        if (ev->finish == KV_FINISH_ERROR) j->finish = "error";
        final_bytes(j);
        j->done = 1;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (ev->finish != KV_FINISH_NONE) job_unref(j);
    return stop;
}

/* The response's content reader (the connection's thread): waits for bytes. */
static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max) {
    job *j = cls;
    (void)pos;
    pthread_mutex_lock(&j->mu);
    while (j->out_pos == j->out_len && !j->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    }
    ssize_t n;
    if (j->out_pos < j->out_len) {
        size_t k = j->out_len - j->out_pos < max ? j->out_len - j->out_pos : max;
        memcpy(buf, j->out + j->out_pos, k);
        j->out_pos += k;
        n = (ssize_t)k;
    } else {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    }
    pthread_mutex_unlock(&j->mu);
    return n;
}

/* libmicrohttpd frees the response: the body went out, or the client left. */
static void reader_free(void *cls) {
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    int cancel = !j->done;
    j->gone = 1;
    pthread_mutex_unlock(&j->mu);
    if (cancel) kv_sched_cancel(j->srv->sched, j->sched_id);
    job_unref(j);
}

static void count(server *s, unsigned code) {
    int k = code == 200                                 ? 0
            : code == 400                               ? 1
            : code == 401                               ? 2
            : code == 413                               ? 4
            : code >= 429 && code != 404 && code != 405 ? 5
                                                        : 3;
    pthread_mutex_lock(&s->mu);
    s->http[k]++;
    pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result send_text(struct MHD_Connection *c, server *s, unsigned code,
                                 const char *type, char *body) {
    count(s, code);
    const char *b = body ? body : "{}";
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(b), (void *)b, MHD_RESPMEM_MUST_COPY);
    free(body);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, server *s, unsigned code,
                                  const char *msg) {
    const char *type = code == 400 || code == 404 || code == 405 || code == 413
                           ? "invalid_request_error"
                       : code == 401 ? "authentication_error"
                       : code == 429 ? "rate_limit_error"
                                     : "server_error";
    return send_text(c, s, code, "application/json", kv_serve_error_json(msg, type, NULL));
}

/* printf onto a growing buffer */
static void addf(char **b, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void addf(char **b, size_t *len, size_t *cap, const char *fmt, ...) {
    char tmp[512], *big = NULL;
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof tmp && (big = malloc((size_t)n + 1))) /* longer: format it again */
        vsnprintf(big, (size_t)n + 1, fmt, again);
    va_end(again);
    if (n > 0)
        buf_add(b, len, cap, big ? big : tmp,
                (size_t)n < sizeof tmp || big ? (size_t)n : sizeof tmp - 1);
    free(big);
}

static void add_hist(char **b, size_t *len, size_t *cap, const char *name, const char *help,
                     const kv_sched_hist *h) {
    const double *le = kv_sched_bucket_bounds();
    addf(b, len, cap, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < KV_SCHED_NBUCKETS - 1; i++)
        addf(b, len, cap, "%s_bucket{le=\"%g\"} %llu\n", name, le[i],
             (unsigned long long)h->count[i]);
    addf(b, len, cap, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
         (unsigned long long)h->n, name, h->sum, name, (unsigned long long)h->n);
}

/* GET /metrics: the Prometheus text format (docs/serve.md "Metrics"). */
static char *metrics_text(server *s) {
    kv_sched_stats st;
    kv_sched_stats_get(s->sched, &st);
    uint64_t http[6];
    pthread_mutex_lock(&s->mu);
    memcpy(http, s->http, sizeof http);
    pthread_mutex_unlock(&s->mu);
    char *b = NULL;
    size_t len = 0, cap = 0;
    addf(&b, &len, &cap,
         "# HELP kvplan_requests_total Requests by outcome.\n"
         "# TYPE kvplan_requests_total counter\n");
    for (int f = KV_FINISH_STOP; f <= KV_FINISH_ERROR; f++)
        addf(&b, &len, &cap, "kvplan_requests_total{outcome=\"%s\"} %llu\n",
             kv_finish_name((kv_finish)f), (unsigned long long)st.finished[f]);
    addf(&b, &len, &cap,
         "kvplan_requests_total{outcome=\"rejected_queue_full\"} %llu\n"
         "kvplan_requests_total{outcome=\"rejected_stopping\"} %llu\n"
         "kvplan_requests_total{outcome=\"rejected_invalid\"} %llu\n",
         (unsigned long long)st.refused_queue_full, (unsigned long long)st.refused_stopping,
         (unsigned long long)(http[1] + http[2] + http[3] + http[4]));
    static const char *cls[6] = {"200", "400", "401", "404", "413", "429_503"};
    addf(&b, &len, &cap, "# TYPE kvplan_http_responses_total counter\n");
    for (int i = 0; i < 6; i++)
        addf(&b, &len, &cap, "kvplan_http_responses_total{code=\"%s\"} %llu\n", cls[i],
             (unsigned long long)http[i]);
    addf(&b, &len, &cap,
         "# TYPE kvplan_prompt_tokens_total counter\nkvplan_prompt_tokens_total %llu\n"
         "# TYPE kvplan_generated_tokens_total counter\nkvplan_generated_tokens_total %llu\n"
         "# TYPE kvplan_running_sequences gauge\nkvplan_running_sequences %d\n"
         "# TYPE kvplan_prefilling_sequences gauge\nkvplan_prefilling_sequences %d\n"
         "# TYPE kvplan_queued_requests gauge\nkvplan_queued_requests %d\n"
         "# TYPE kvplan_running_sequences_peak gauge\nkvplan_running_sequences_peak %d\n",
         (unsigned long long)st.prompt_tokens, (unsigned long long)st.generated_tokens, st.running,
         st.prefilling, st.queued, st.peak_running);
    addf(&b, &len, &cap,
         "# HELP kvplan_kv_bytes K/V bytes: blocks held (in_use, peak), admitted reservations "
         "(reserved, reserved_peak), --kv-mem (capacity).\n# TYPE kvplan_kv_bytes gauge\n"
         "kvplan_kv_bytes{kind=\"in_use\"} %zu\nkvplan_kv_bytes{kind=\"peak\"} %zu\n"
         "kvplan_kv_bytes{kind=\"reserved\"} %zu\nkvplan_kv_bytes{kind=\"reserved_peak\"} %zu\n"
         "kvplan_kv_bytes{kind=\"capacity\"} %zu\n",
         st.kv_in_use, st.kv_peak, st.kv_reserved, st.kv_reserved_peak, st.kv_capacity);
    addf(&b, &len, &cap,
         "# HELP kvplan_admission_refusals_total Requests refused (queue full, stopping, more "
         "than the KV memory).\n# TYPE kvplan_admission_refusals_total counter\n"
         "kvplan_admission_refusals_total{reason=\"queue_full\"} %llu\n"
         "kvplan_admission_refusals_total{reason=\"stopping\"} %llu\n"
         "kvplan_admission_refusals_total{reason=\"too_big\"} %llu\n"
         "# HELP kvplan_admission_waits_total Steps whose next queued request did not fit the "
         "free KV bytes.\n# TYPE kvplan_admission_waits_total counter\n"
         "kvplan_admission_waits_total %llu\n# TYPE kvplan_steps_total counter\n"
         "kvplan_steps_total %llu\n",
         (unsigned long long)st.refused_queue_full, (unsigned long long)st.refused_stopping,
         (unsigned long long)st.refused_too_big, (unsigned long long)st.admission_waits,
         (unsigned long long)st.steps);
    addf(&b, &len, &cap,
         "# HELP kvplan_attention_entries_total Attention work: (query row, KV head, cached "
         "entry) triples the steps attended.\n# TYPE kvplan_attention_entries_total counter\n"
         "kvplan_attention_entries_total %llu\n",
         (unsigned long long)st.attended);
    add_hist(&b, &len, &cap, "kvplan_time_to_first_token_seconds",
             "From the request's arrival to its first token.", &st.ttft);
    add_hist(&b, &len, &cap, "kvplan_inter_token_latency_seconds",
             "Between a request's consecutive tokens.", &st.itl);
    return b;
}

static char *models_json(server *s) {
    cJSON *o = cJSON_CreateObject(), *d = cJSON_AddArrayToObject(o, "data"),
          *m = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(d, m);
    cJSON_AddStringToObject(m, "id", s->o->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "kvplan");
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return t;
}

/* Tokenize, check the lengths and make the job; 0, or an HTTP status with msg. */
static unsigned make_job(server *s, kv_serve_req *rq, job **out, int **ids, int *n, char *msg,
                         size_t cap) {
    kv_error err = {0};
    pthread_mutex_lock(&s->mu);
    int rc = kv_tokenizer_encode(s->tok, rq->prompt, strlen(rq->prompt), 1, ids, n, &err);
    uint64_t seq = ++s->next_job;
    pthread_mutex_unlock(&s->mu);
    if (rc) {
        snprintf(msg, cap, "the prompt cannot be tokenized: %s", err.msg);
        return 400;
    }
    int C = s->o->ctx;
    if (*n >= C) {
        snprintf(msg, cap, "the prompt has %d tokens (BOS included); the context is %d", *n, C);
        return 400;
    }
    if (rq->max_tokens < 0) rq->max_tokens = rq->chat ? C - *n : 16;
    if (rq->max_tokens > C - *n) {
        snprintf(msg, cap,
                 "max_tokens %ld is more than the %d tokens the context leaves (%d - %d prompt "
                 "tokens)",
                 rq->max_tokens, C - *n, C, *n);
        return 400;
    }
    job *j = calloc(1, sizeof *j);
    if (!j) return 500;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->srv = s;
    j->req = *rq;
    memset(rq, 0, sizeof *rq);
    snprintf(j->id, sizeof j->id, "%s-%llu", j->req.chat ? "chatcmpl" : "cmpl",
             (unsigned long long)seq);
    j->ident = (kv_serve_ident){j->req.chat, j->id, s->o->model_id, (long)time(NULL)};
    *out = j;
    return 0;
}

/* POST /v1/completions, /v1/chat/completions. */
static enum MHD_Result generate(struct MHD_Connection *c, server *s, const char *body, size_t len,
                                int chat) {
    char msg[1200];
    kv_serve_req rq;
    if (kv_serve_parse(body, len, chat, s->o->chat, s->o->model_id, &rq, msg, sizeof msg))
        return send_error(c, s, 400, msg);
    job *j = NULL;
    int *ids = NULL, n = 0;
    unsigned code = make_job(s, &rq, &j, &ids, &n, msg, sizeof msg);
    kv_serve_req_free(&rq);
    if (code) {
        free(ids);
        return send_error(c, s, code, code == 500 ? "out of memory" : msg);
    }
    kv_sched_request r = {ids,
                          n,
                          (int)j->req.max_tokens,
                          (float)j->req.temperature,
                          (float)j->req.top_p,
                          j->req.seed,
                          on_event,
                          j};
    kv_error err = {0};
    kv_sched_status st = kv_sched_submit(s->sched, &r, &j->sched_id, &err);
    free(ids);
    if (st != KV_SCHED_OK) {
        j->refs = 1;
        job_unref(j);
        if (st == KV_SCHED_QUEUE_FULL)
            return send_error(c, s, 429, "the server's queue is full; retry later");
        if (st == KV_SCHED_STOPPING) return send_error(c, s, 503, "the server is shutting down");
        return send_error(c, s, 400, err.msg);
    }
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, reader, j, reader_free);
    if (!resp) {
        reader_free(j);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type",
                            j->req.stream ? "text/event-stream" : "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    count(s, 200);
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    /* no idle timeout while the answer is generated (queued for memory, or a long non-streamed
     * answer sends nothing for a while); completed_cb restores it */
    if (ret == MHD_YES) MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    return ret;
}

typedef struct conn {
    char *body;
    size_t len, cap;
    int too_big;
} conn;

static int authorized(struct MHD_Connection *c, server *s) {
    if (!s->o->api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, s->o->api_key);
}

/* Route a request whose body has arrived. */
static enum MHD_Result route(struct MHD_Connection *c, server *s, const char *url,
                             const char *method, conn *k) {
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health") && get)
        return send_text(c, s, 200, "application/json", strdup("{\"status\":\"ok\"}"));
    if (!strcmp(url, "/metrics") && get)
        return send_text(c, s, 200, "text/plain; version=0.0.4", metrics_text(s));
    int known = !strcmp(url, "/v1/models") || !strcmp(url, "/v1/completions") ||
                !strcmp(url, "/v1/chat/completions") || !strcmp(url, "/health") ||
                !strcmp(url, "/metrics");
    if (!known) return send_error(c, s, 404, "no such endpoint");
    if (!authorized(c, s))
        return send_error(c, s, 401, "a valid 'Authorization: Bearer KEY' header is required");
    if (!strcmp(url, "/v1/models") && get)
        return send_text(c, s, 200, "application/json", models_json(s));
    if (!post || !strncmp(url, "/v1/models", 10))
        return send_error(c, s, 405, "method not allowed");
    if (k->too_big) return send_error(c, s, 413, "the request body is larger than 1 MiB");
    pthread_mutex_lock(&s->mu);
    int stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    if (stopping) return send_error(c, s, 503, "the server is shutting down");
    return generate(c, s, k->body ? k->body : "", k->len, !strcmp(url, "/v1/chat/completions"));
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls) {
    (void)version;
    server *s = cls;
    conn *k = *con_cls;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k) return MHD_NO;
        *con_cls = k;
        return MHD_YES;
    }
    if (*upload_size) {
        if (k->len + *upload_size > KV_SERVE_MAX_BODY)
            k->too_big = 1;
        else if (buf_add(&k->body, &k->len, &k->cap, upload, *upload_size))
            k->too_big = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    return route(c, s, url, method, k);
}

static void completed_cb(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    server *s = cls;
    conn *k = *con_cls;
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o->timeout_s);
    if (!k) return;
    free(k->body);
    free(k);
    *con_cls = NULL;
}

typedef struct sched_thread {
    kv_sched *s;
    kv_error err;
    int rc;
} sched_thread;

static void *sched_main(void *arg) {
    sched_thread *t = arg;
    t->rc = kv_sched_run(t->s, &t->err);
    return NULL;
}

static struct MHD_Daemon *start_daemon(server *srv, const kv_server_opts *o, kv_error *err) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)o->port);
    if (inet_pton(AF_INET, o->host, &sa.sin_addr) != 1) {
        kv_fail(err, KV_EINPUT, "--host %s is not an IPv4 address (e.g. 127.0.0.1)", o->host);
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD;
    if (!o->quiet) flags |= MHD_USE_ERROR_LOG;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, access_cb, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)1024, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(512 << 10),
        MHD_OPTION_NOTIFY_COMPLETED, completed_cb, srv, MHD_OPTION_END);
    if (!d)
        kv_fail(err, KV_EINPUT,
                "cannot listen on %s:%d (in use, or not an address of this "
                "machine); pick another --port or --host",
                o->host, o->port);
    return d;
}

int kv_serve_run(kv_sched *sched, const kv_tokenizer *tok, const kv_server_opts *o, kv_error *err) {
    server srv = {.sched = sched, .tok = tok, .o = o};
    pthread_mutex_init(&srv.mu, NULL);
    sched_thread st = {.s = sched};
    pthread_t th;
    int rc = KV_OK;
    struct MHD_Daemon *d = start_daemon(&srv, o, err);
    if (!d) rc = KV_EINPUT;
    if (!rc && pthread_create(&th, NULL, sched_main, &st)) {
        rc = kv_fail(err, KV_EINTERNAL, "cannot start the scheduler's thread");
        MHD_stop_daemon(d);
    }
    if (rc) {
        pthread_mutex_destroy(&srv.mu);
        return rc;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "kvplan serve: listening on http://%s:%u (model %s)\n", o->host,
            info ? (unsigned)info->port : (unsigned)o->port, o->model_id);
    fflush(stderr);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int sig = 0;
    sigwait(&set, &sig);
    if (!o->quiet)
        fprintf(stderr, "kvplan serve: %s: stopping (running requests have %.0f s)\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM", o->drain_s);
    pthread_mutex_lock(&srv.mu);
    srv.stopping = 1;
    pthread_mutex_unlock(&srv.mu);
    kv_sched_stop(sched, o->drain_s);
    pthread_join(th, NULL);
    MHD_stop_daemon(d);
    pthread_mutex_destroy(&srv.mu);
    if (st.rc) {
        *err = st.err;
        return st.rc;
    }
    return KV_OK;
}
