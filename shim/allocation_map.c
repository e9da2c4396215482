#include "allocation_map.h"

#include <stdlib.h>

static size_t slot_of(uint64_t key, size_t capacity)
{
    key ^= key >> 33; /* addresses share low zero bits: mix them */
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (capacity - 1);
}

static void place(struct allocation *slots, size_t capacity, const struct allocation *entry)
{
    size_t slot = slot_of(entry->key, capacity);
    while (slots[slot].key != 0)
        slot = (slot + 1) & (capacity - 1);
    slots[slot] = *entry;
}

static int grow(struct allocation_map *map)
{
    size_t capacity = map->capacity ? map->capacity * 2 : 64;
    struct allocation *slots = calloc(capacity, sizeof *slots);
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < map->capacity; i++)
        if (map->slots[i].key != 0)
            place(slots, capacity, &map->slots[i]);
    free(map->slots);
    map->slots = slots;
    map->capacity = capacity;
    return 0;
}

int allocation_map_put(struct allocation_map *map, const struct allocation *entry)
{
    struct allocation *existing = allocation_map_find(map, entry->key);
    if (existing != NULL) {
        *existing = *entry;
        return 0;
    }
    if ((map->used + 1) * 2 > map->capacity && grow(map) != 0)
        return -1;
    place(map->slots, map->capacity, entry);
    map->used++;
    return 0;
}

struct allocation *allocation_map_find(struct allocation_map *map, uint64_t key)
{
    if (map->capacity == 0 || key == 0)
        return NULL;
    for (size_t slot = slot_of(key, map->capacity);; slot = (slot + 1) & (map->capacity - 1)) {
        if (map->slots[slot].key == key)
            return &map->slots[slot];
        if (map->slots[slot].key == 0)
            return NULL;
    }
}

/* Linear probing with backward-shift deletion: no tombstones to pile up. */
int allocation_map_take(struct allocation_map *map, uint64_t key, struct allocation *out)
{
    struct allocation *found = allocation_map_find(map, key);
    if (found == NULL)
        return 0;
    if (out != NULL)
        *out = *found;
    size_t mask = map->capacity - 1;
    size_t hole = (size_t)(found - map->slots);
    for (size_t next = (hole + 1) & mask; map->slots[next].key != 0; next = (next + 1) & mask) {
        size_t home = slot_of(map->slots[next].key, map->capacity);
        /* Move next into the hole unless its home lies cyclically in (hole, next]. */
        int stays = hole <= next ? (hole < home && home <= next) : (hole < home || home <= next);
        if (!stays) {
            map->slots[hole] = map->slots[next];
            hole = next;
        }
    }
    map->slots[hole].key = 0;
    map->used--;
    return 1;
}
