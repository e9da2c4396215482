/* Test client that is linked to libcuda (-lcuda) and calls the exported
 * symbols directly, as a program built against the driver API does. */
#include "workload.h"

static int load_linked(struct driver *driver, int per_thread)
{
    (void)per_thread; /* the linked symbols are fixed at build time */
#define STANDIN_LINK(base, symbol) driver->base = symbol;
    DRIVER_API(STANDIN_LINK)
#undef STANDIN_LINK
    return 0;
}

int main(int argc, char **argv)
{
    return client_main("linked", load_linked, argc, argv);
}
