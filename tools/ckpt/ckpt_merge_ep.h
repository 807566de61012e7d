/* zero-ckpt merge-ep DIR OUT_DIR (ckpt_merge_ep.c): exit status 0, or 1 with a message on stderr. */
#ifndef ZERO_TOOLS_CKPT_MERGE_EP_H
#define ZERO_TOOLS_CKPT_MERGE_EP_H
int zero_ckpt_merge_ep(const char *dir, const char *out);
#endif
