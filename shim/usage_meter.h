/* How long this process keeps each GPU busy: the measure the agent schedules
 * by (NVSHARE_MSG_GPU_USAGE).  Sampled on the client thread. */
#ifndef NVSHARE_USAGE_METER_H
#define NVSHARE_USAGE_METER_H

#include <stdint.h>

/* Samples every GPU this process may be running on (gate open, or work still
 * queued); returns the milliseconds until the next sample is due, or -1 when no
 * GPU needs one. */
int nvshare_usage_sample(double now_ms);

/* 1 and the running total for a GPU_USAGE frame when gpu's total changed and
 * the last frame is at least USAGE_REPORT_MS old (or force), else 0. */
int nvshare_usage_take_report(int gpu, double now_ms, int force, uint64_t *busy_us);

/* A new connection: the totals start again from 0. */
void nvshare_usage_reset(void);

#endif
