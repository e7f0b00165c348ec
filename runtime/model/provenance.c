/* The model's provenance in an HDF5 file's root attributes (kvplan/model.h): in the model room,
 * which knows kv_model; runtime/util's writers do not. */
#include "kvplan/h5io.h"
#include "kvplan/model.h"

#include <stdio.h>
#include <time.h>

int kv_h5_write_provenance(kv_h5 *f, const char *command, const kv_model *m, kv_error *err) {
    char created[32];
    time_t now = time(NULL);
    struct tm tmv;
    if (!gmtime_r(&now, &tmv) || !strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tmv))
        snprintf(created, sizeof created, "1970-01-01T00:00:00Z");
    int rc;
    if ((rc = kv_h5_attr_str(f, "/", "kvplan_version", KVPLAN_VERSION_STRING, err))) return rc;
    if ((rc = kv_h5_attr_i64(f, "/", "schema_version", KV_SCHEMA_VERSION, err))) return rc;
    if ((rc = kv_h5_attr_str(f, "/", "created", created, err))) return rc;
    if ((rc = kv_h5_attr_str(f, "/", "command", command ? command : "", err))) return rc;
    if ((rc = kv_h5_attr_str(f, "/", "model_sha256", m ? m->sha256 : "", err))) return rc;
    if (!m) return KV_OK;
    const kv_config *c = &m->cfg;
    if ((rc = kv_h5_attr_str(f, "/", "model_format", m->format, err))) return rc;
    if ((rc = kv_h5_attr_str(f, "/", "model_path", m->path, err))) return rc;
    const struct {
        const char *name;
        long v;
    } ints[] = {
        {"model_dim", c->dim},
        {"model_hidden_dim", c->hidden_dim},
        {"model_n_layers", c->n_layers},
        {"model_n_heads", c->n_heads},
        {"model_n_kv_heads", c->n_kv_heads},
        {"model_head_dim", c->head_dim},
        {"model_vocab_size", c->vocab_size},
        {"model_seq_len", c->seq_len},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if ((rc = kv_h5_attr_i64(f, "/", ints[i].name, ints[i].v, err))) return rc;
    return KV_OK;
}
