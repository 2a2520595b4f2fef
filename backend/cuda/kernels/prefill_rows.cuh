// prefill_rows.cuh: the online softmax of one lane's two query rows and
// their output store, shared by the prefill kernels (attn_prefill.cu on
// mma.sync, attn_prefill_wg.cu on wgmma). Both keep a key tile's scores S
// and the output O in the C-fragment layout of m16n8 tiles, flat: element
// 4n + e of a lane's array is column 8n + 2*tq + (e & 1) of row ra (e < 2)
// or of row rb = ra + 8 (e >= 2), tq = lane % 4. Include after HD (head
// dim) and BN (keys per tile) are defined; needs common.cuh and mma.cuh.
#pragma once

// rows2 is the softmax state of a lane's two rows: the running max (log2
// domain), this lane's partial sum of exponents, the rows' positions and
// the lowest key each row sees.
struct rows2 {
  float ma, mb, la, lb;
  int pa, pb, loa, lob;
};

// rows_at returns the state of rows at positions pa and pb = pa + 8 before
// any key: no max, empty sums, and with a window (window > 0) the lowest
// key each row sees.
__device__ __forceinline__ rows2 rows_at(int pa, int pb, int window) {
  return {NEG_INF, NEG_INF, 0.f, 0.f, pa, pb, window > 0 ? max(0, pa - window + 1) : 0, window > 0 ? max(0, pb - window + 1) : 0};
}

// softmax_tile turns the scores of keys [k0, k0+BN) in sc into exponents
// against the rows' new maxima, masking the keys a row must not see (past
// its position, below its window) when masked says the tile crosses an
// edge, updates r's maxima and sums, and returns the factors the rows'
// earlier sums and outputs are scaled by.
__device__ __forceinline__ void softmax_tile(float (&sc)[BN / 2], rows2& r, int k0, bool masked, int tq, float scale_log2,
                                             float& ala, float& alb) {
  if (masked) {
#pragma unroll
    for (int jn = 0; jn < BN / 8; jn++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int key = k0 + jn * 8 + tq * 2 + (e & 1);
        bool ok = e < 2 ? (key <= r.pa && key >= r.loa) : (key <= r.pb && key >= r.lob);
        sc[4 * jn + e] = ok ? sc[4 * jn + e] * scale_log2 : NEG_INF;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < BN / 2; i++) sc[i] *= scale_log2;
  }
  float mxa = NEG_INF, mxb = NEG_INF;
#pragma unroll
  for (int jn = 0; jn < BN / 8; jn++) {
    mxa = fmaxf(mxa, fmaxf(sc[4 * jn], sc[4 * jn + 1]));
    mxb = fmaxf(mxb, fmaxf(sc[4 * jn + 2], sc[4 * jn + 3]));
  }
  // A row's 4 lanes (same lane/4) hold its BN scores between them.
  mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 1));
  mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 2));
  mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 1));
  mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 2));
  const float mna = fmaxf(r.ma, mxa), mnb = fmaxf(r.mb, mxb);
  // While a row has seen only masked keys its max is -inf: exponents are
  // then taken against 0 (giving 0), never -inf - -inf.
  const float refa = mna == NEG_INF ? 0.f : mna, refb = mnb == NEG_INF ? 0.f : mnb;
  ala = fast_exp2(r.ma - refa);
  alb = fast_exp2(r.mb - refb);
  r.ma = mna;
  r.mb = mnb;
  float rsa = 0.f, rsb = 0.f;
#pragma unroll
  for (int jn = 0; jn < BN / 8; jn++) {
    sc[4 * jn] = fast_exp2(sc[4 * jn] - refa);
    sc[4 * jn + 1] = fast_exp2(sc[4 * jn + 1] - refa);
    sc[4 * jn + 2] = fast_exp2(sc[4 * jn + 2] - refb);
    sc[4 * jn + 3] = fast_exp2(sc[4 * jn + 3] - refb);
    rsa += sc[4 * jn] + sc[4 * jn + 1];
    rsb += sc[4 * jn + 2] + sc[4 * jn + 3];
  }
  // l stays a per-lane partial sum (this lane's columns); the factors are
  // per row, so the quad's partials are summed once, in store_rows.
  r.la = r.la * ala + rsa;
  r.lb = r.lb * alb + rsb;
}

// scale_o scales O by the rows' factors.
__device__ __forceinline__ void scale_o(float (&o)[HD / 2], float ala, float alb) {
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
    o[4 * n] *= ala;
    o[4 * n + 1] *= ala;
    o[4 * n + 2] *= alb;
    o[4 * n + 3] *= alb;
  }
}

// p_frag packs the exponents of keys [16kc, 16kc+16) in sc into P's A
// fragment a: they are the C fragments of key tiles 2kc and 2kc+1 (a[0] =
// row ra of tile 2kc, a[1] = row rb of it, a[2] and a[3] the same of tile
// 2kc+1).
__device__ __forceinline__ void p_frag(u32 (&a)[4], const float (&sc)[BN / 2], int kc) {
  a[0] = pack_bf16x2(sc[8 * kc], sc[8 * kc + 1]);
  a[1] = pack_bf16x2(sc[8 * kc + 2], sc[8 * kc + 3]);
  a[2] = pack_bf16x2(sc[8 * kc + 4], sc[8 * kc + 5]);
  a[3] = pack_bf16x2(sc[8 * kc + 6], sc[8 * kc + 7]);
}

// store_rows divides O by the rows' sums (a row that saw no key gets
// zeros) and stores it, bf16, as head h of rows q0 + ra and q0 + rb of
// out [T, H*HD]; rows below 0 (the missing part of a ragged tile) are not
// stored.
__device__ __forceinline__ void store_rows(u16* out, const float (&o)[HD / 2], const rows2& r, int q0, int ra, int rb, int h,
                                           int H, int tq) {
  float la = r.la, lb = r.lb;
  la += __shfl_xor_sync(0xffffffffu, la, 1);
  la += __shfl_xor_sync(0xffffffffu, la, 2);
  lb += __shfl_xor_sync(0xffffffffu, lb, 1);
  lb += __shfl_xor_sync(0xffffffffu, lb, 2);
  const float inva = la > 0.f ? 1.f / la : 0.f, invb = lb > 0.f ? 1.f / lb : 0.f;
  u16* oa = out + ((i64)(q0 + ra) * H + h) * HD + tq * 2;
  u16* ob = out + ((i64)(q0 + rb) * H + h) * HD + tq * 2;
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
    if (ra >= 0) *(u32*)(oa + n * 8) = pack_bf16x2(o[4 * n] * inva, o[4 * n + 1] * inva);
    if (rb >= 0) *(u32*)(ob + n * 8) = pack_bf16x2(o[4 * n + 2] * invb, o[4 * n + 3] * invb);
  }
}
