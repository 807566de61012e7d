/* A program compiled against an older header (old_header/zero_old.h: the
 * versioned structs as they were at version OLD_CONFIG_VERSION) runs against
 * this library:
 *   - its smaller zero_config and zero_comm_config are accepted;
 *   - the fields its version lacks take their defaults, not the bytes that
 *     follow its struct in memory (poisoned here with 0xA5, which the
 *     library would refuse if it read them: an offload device or
 *     local_accumulation of 0xA5A5A5A5);
 *   - zero_config_from_json writes only the caller's fields (the poison after
 *     the struct is intact) and refuses a key whose field is newer than the
 *     caller's version, naming the version and the field;
 *   - a version the library does not know (0, or newer: a caller built
 *     against a newer libzero) and a size smaller than the version's fields
 *     are refused, naming both. */
#include <string.h>

#include "check.h"
#include "zero_old.h"

#define POISON 0xA5
#define SLACK 2048 /* more than every field appended since */

/* The caller's struct followed by poison, as if the next bytes of its memory held anything. */
typedef struct {
    _Alignas(16) unsigned char bytes[sizeof(zero_config) + SLACK];
} config_room;

static zero_config *place(config_room *room, const zero_config *c)
{
    memset(room->bytes, POISON, sizeof room->bytes);
    memcpy(room->bytes, c, sizeof *c);
    return (zero_config *)room->bytes;
}

static int poison_intact(const config_room *room)
{
    for (size_t i = sizeof(zero_config); i < sizeof room->bytes; i++)
        if (room->bytes[i] != POISON) return 0;
    return 1;
}

static void from_json(void)
{
    config_room room;
    zero_config init = ZERO_CONFIG_INIT;
    zero_config *c = place(&room, &init);
    CHECK_OK(zero_config_from_json(c, "{\"zero_optimization\": {\"stage\": 2}, \"optimizer\": {\"type\": "
                                      "\"AdamW\", \"params\": {\"lr\": 0.5, \"weight_decay\": 0.0}}}"));
    CHECK(c->stage == 2 && c->lr == 0.5 && c->weight_decay == 0.0 && c->beta2 == 0.999);
    CHECK(c->size == sizeof(zero_config) && c->version == OLD_CONFIG_VERSION);
    CHECK_MSG(poison_intact(&room), "zero_config_from_json wrote past a version-%d caller's struct",
              OLD_CONFIG_VERSION);

    /* A key of a newer version: the caller could not see the value. */
    zero_config before = *c;
    zero_status st = zero_config_from_json(c, "{\"zero_optimization\": {\"stage\": 1, \"local_accumulation\": true}}");
    CHECK(st == ZERO_CONFIG);
    CHECK_MSG(strstr(zero_last_error(), "version 4") && strstr(zero_last_error(), "local_accumulation"),
              "message: %s", zero_last_error());
    CHECK(memcmp(c, &before, sizeof before) == 0);
    CHECK(poison_intact(&room));
#if OLD_CONFIG_VERSION < 2
    st = zero_config_from_json(c, "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\"}}}");
    CHECK(st == ZERO_CONFIG);
    CHECK_MSG(strstr(zero_last_error(), "version 2") && strstr(zero_last_error(), "offload_optimizer_device"),
              "message: %s", zero_last_error());
#endif
}

static void engine(zero_comm *comm, zero_device *dev)
{
    config_room room;
    zero_config init = ZERO_CONFIG_INIT;
    init.stage = OLD_CONFIG_VERSION == 3 ? 2 : 1; /* local_accumulation = 1 would be refused at stage 2 */
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, place(&room, &init), comm, dev));
    int m = -1;
    const int64_t shape[1] = {10};
    CHECK_OK(zero_engine_add_module(e, "m", &m));
    CHECK_OK(zero_engine_add_param(e, m, "w", 1, shape, NULL, NULL));
    CHECK_OK(zero_engine_finalize(e));
    zero_engine_destroy(e);

    /* Refusals name what is wrong. */
    zero_config bad = init;
    bad.version = 0;
    CHECK(zero_engine_create(&e, &bad, comm, dev) == ZERO_CONFIG && e == NULL);
    CHECK_MSG(strstr(zero_last_error(), "version 0 is not one this libzero knows"), "%s", zero_last_error());
    bad.version = 99;
    CHECK(zero_engine_create(&e, &bad, comm, dev) == ZERO_CONFIG && e == NULL);
    CHECK_MSG(strstr(zero_last_error(), "built against a newer libzero"), "%s", zero_last_error());
    bad.version = OLD_CONFIG_VERSION;
    bad.size = offsetof(zero_config, min_loss_scale); /* cuts off the last field of version 1 */
    CHECK(zero_engine_create(&e, &bad, comm, dev) == ZERO_CONFIG && e == NULL);
    CHECK_MSG(strstr(zero_last_error(), "smaller than its version") && strstr(zero_last_error(), "ZERO_CONFIG_INIT"),
              "%s", zero_last_error());
}

int main(void)
{
    /* A version-1 comm config followed by poison where `fingerprint` now lies. */
    struct {
        zero_comm_config c;
        unsigned char poison[64];
    } comm_room;
    memset(&comm_room, POISON, sizeof comm_room);
    zero_comm_config cc = ZERO_COMM_CONFIG_INIT;
    cc.backend = 4; /* LOCAL */
    comm_room.c = cc;
    zero_comm *comm = NULL;
    zero_device *dev = NULL;
    CHECK_OK(zero_comm_create_world(&comm, &comm_room.c));
    CHECK_OK(zero_device_create(&dev, 0, 0));
    if (comm && dev) {
        from_json();
        engine(comm, dev);
    }
    zero_device_destroy(dev);
    zero_comm_destroy(comm);
    return check_exit();
}
