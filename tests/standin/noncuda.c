/* A program that never touches CUDA.  Under the shim's preload it must see
 * exactly what it sees without it: it prints its own thread count, open file
 * descriptors, whether any libcuda or libnvshare is mapped, whether probing
 * for the driver (dlsym(RTLD_DEFAULT, "cuInit")) finds it, and its
 * environment, so the test can compare the two runs. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

static int count_entries(const char *path, int print)
{
    DIR *dir = opendir(path);
    if (dir == NULL)
        return -1;
    int fd_of_dir = dirfd(dir), count = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] == '.' || atoi(entry->d_name) == fd_of_dir)
            continue;
        if (print)
            printf(" %s", entry->d_name);
        count++;
    }
    closedir(dir);
    return count;
}

static int mapped(const char *needle)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    if (maps == NULL)
        return -1;
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof line, maps) != NULL)
        found |= strstr(line, needle) != NULL;
    fclose(maps);
    return found;
}

int main(void)
{
    printf("cuInit_found=%d\n", dlsym(RTLD_DEFAULT, "cuInit") != NULL);
    printf("threads=%d\n", count_entries("/proc/self/task", 0));
    printf("fds=");
    count_entries("/proc/self/fd", 1);
    printf("\nlibcuda=%d\nlibnvshare=%d\n", mapped("libcuda"), mapped("libnvshare"));
    for (char **e = environ; *e != NULL; e++)
        printf("env %s\n", *e);
    return 0;
}
