/* Each thread's scratch buffers, kept between calls (a fresh malloc of a
   few hundred KiB per call maps and faults in new pages) and freed when
   the thread exits: SCRATCH_SLOTS buffers per thread and per module (each
   module that includes this has its own), a slot per use (the module's
   own names for them). */

#ifndef KERAS_IPU_SCRATCH_H
#define KERAS_IPU_SCRATCH_H

#include <pthread.h>
#include <stdlib.h>

#define SCRATCH_SLOTS 2

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
typedef struct { char *p[SCRATCH_SLOTS]; size_t size[SCRATCH_SLOTS]; } scratch_t;

static void scratch_free(void *s) {
    if (s != NULL) {
        for (int k = 0; k < SCRATCH_SLOTS; k++) free(((scratch_t *)s)->p[k]);
        free(s);
    }
}

static void scratch_key_make(void) { (void)pthread_key_create(&scratch_key, scratch_free); }

/* The calling thread's buffer `slot` of at least `size` bytes (its
   contents are not kept when it grows), or NULL where memory is short. */
static char *thread_scratch(int slot, size_t size) {
    (void)pthread_once(&scratch_once, scratch_key_make);
    scratch_t *s = (scratch_t *)pthread_getspecific(scratch_key);
    if (s == NULL) {
        s = (scratch_t *)calloc(1, sizeof(scratch_t));
        if (s == NULL || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->size[slot] < size) {
        char *p = (char *)malloc(size);
        if (p == NULL) return NULL;
        free(s->p[slot]);
        s->p[slot] = p;
        s->size[slot] = size;
    }
    return s->p[slot];
}

#endif
