"""The shim's dlsym: both glibc symbol versions hand out hooks, and
dlsym(RTLD_NEXT, ...) still means "next after the caller" for other
interposers preloaded behind the shim."""

import subprocess

from shim_harness import SHIM, STANDIN_BUILD, clean_env

# Calls dlsym@GLIBC_2.34 (the default for new binaries) and dlsym@GLIBC_2.2.5 (what
# binaries linked before glibc 2.34 reference) on a libcuda handle.
PROGRAM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
__asm__(".symver dlsym_2_2_5, dlsym@GLIBC_2.2.5");
void *dlsym_2_2_5(void *, const char *);
static const char *owner(void *p) { Dl_info i; return p && dladdr(p, &i) ? i.dli_fname : "none"; }
int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    printf("getpid_ok=%d\n", getpid() > 0);
    printf("new=%s\n", owner(dlsym(cuda, "cuLaunchKernel")));
    printf("old=%s\n", owner(dlsym_2_2_5(cuda, "cuLaunchKernel")));
    printf("unhooked=%s\n", owner(dlsym(cuda, "cuDeviceGetName")));
    return 0;
}
"""

# Another interposer behind the shim: if the shim's dlsym made glibc see the shim
# as the caller, RTLD_NEXT would find this very getpid again and recurse forever.
WRAPPER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>
pid_t getpid(void) {
    pid_t (*next)(void) = (pid_t (*)(void))dlsym(RTLD_NEXT, "getpid");
    return next();
}
"""


def test_both_dlsym_versions_hook_and_rtld_next_stays_relative_to_the_caller(tmp_path):
    (tmp_path / "program.c").write_text(PROGRAM)
    (tmp_path / "wrapper.c").write_text(WRAPPER)
    subprocess.run(["gcc", "-o", tmp_path / "program", tmp_path / "program.c", "-ldl"], check=True)
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-o",
            tmp_path / "libwrapper.so",
            tmp_path / "wrapper.c",
            "-ldl",
        ],
        check=True,
    )
    env = clean_env(
        LD_LIBRARY_PATH=str(STANDIN_BUILD),
        NVSHARE_SOCKET=str(tmp_path / "none.sock"),
        LD_PRELOAD=f"{SHIM} {tmp_path / 'libwrapper.so'}",
    )
    done = subprocess.run(
        [tmp_path / "program"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert result["getpid_ok"] == "1"
    assert result["new"] == str(SHIM)
    assert result["old"] == str(SHIM)
    assert result["unhooked"].endswith("libcuda.so.1")


# A library that needs libcuda, loaded with RTLD_LOCAL (as Python loads extension modules):
# libcuda is in its own scope, not the global one. Its dlsym(RTLD_DEFAULT, ...) searches
# the caller's scope, so the shim must not make glibc see the shim as the caller.
PLUGIN = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
extern int cuDriverGetVersion(int *);
int plugin_driver_version(void) { int v = 0; cuDriverGetVersion(&v); return v; }
void *plugin_lookup(const char *name) {
    void *volatile found = dlsym(RTLD_DEFAULT, name);   /* volatile: no tail call here */
    return found;
}
"""

LOADER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
static const char *owner(void *p) { Dl_info i; return p && dladdr(p, &i) ? i.dli_fname : "none"; }
int main(int argc, char **argv) {
    void *plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (plugin == NULL) { printf("error=%s\n", dlerror()); return 1; }
    void *(*lookup)(const char *) = (void *(*)(const char *))dlsym(plugin, "plugin_lookup");
    printf("unhooked=%s\n", owner(lookup("cuDeviceGetName")));
    printf("hooked=%s\n", owner(lookup("cuLaunchKernel")));
    return 0;
}
"""


def test_rtld_default_lookups_from_a_locally_loaded_library_find_its_libcuda(tmp_path):
    (tmp_path / "plugin.c").write_text(PLUGIN)
    (tmp_path / "loader.c").write_text(LOADER)
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-o",
            tmp_path / "libplugin.so",
            tmp_path / "plugin.c",
            f"-L{STANDIN_BUILD}",
            "-lcuda",
            "-ldl",
        ],
        check=True,
    )
    subprocess.run(["gcc", "-o", tmp_path / "loader", tmp_path / "loader.c", "-ldl"], check=True)
    env = clean_env(
        LD_LIBRARY_PATH=str(STANDIN_BUILD),
        NVSHARE_SOCKET=str(tmp_path / "none.sock"),
        LD_PRELOAD=str(SHIM),
    )
    done = subprocess.run(
        [tmp_path / "loader", tmp_path / "libplugin.so"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert result["unhooked"].endswith("libcuda.so.1"), result
    assert result["hooked"] == str(SHIM), result
