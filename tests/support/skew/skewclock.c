/* A process whose own wall clock is off: preloaded, this shifts every read of the wall clock
 * (clock_gettime on CLOCK_REALTIME and its coarse and TAI forms, gettimeofday, time) by
 * SKEW_CLOCK_SECONDS (a signed number). The monotonic clocks are untouched, so sleeps, timeouts
 * and waits behave exactly as before: only what the process believes the time of day is moves.
 * Built by tests/support/skew.py with the system's C compiler; for tests only. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long skew_ns(void) {
    static int read = 0;
    static long long value = 0;
    if (!read) {
        const char *text = getenv("SKEW_CLOCK_SECONDS");
        value = text ? (long long)(strtod(text, NULL) * 1e9) : 0;
        read = 1;
    }
    return value;
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + skew_ns();
    ts->tv_sec = (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000L;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *) = NULL;
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int result = real(id, ts);
    if (result == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI)) shift(ts);
    return result;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    if (tv == NULL) return 0;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
