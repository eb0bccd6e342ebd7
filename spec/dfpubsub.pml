/*
 * dfpubsub's reliability protocol, model-checked (issue 47; docs/model.md explains it).
 *
 * One store with a change feed, NbApi writing to it and publishing each write directly (its
 * publisher dies or says bye, and restarts with a new id), df-feed publishing the feed (its
 * batch may fail and stay pending, the feed's history may be trimmed under it), a channel that
 * drops, duplicates and reorders, and one subscriber: the sequence tracker of docs/protocol.md
 * §8 (dfpubsub/tracker.py), a versioned cache with tombstones (controller/cache.py), repair by
 * replay from a position or relist (controller/replay.py, runtime.py _repair) and bookmarks
 * (controller/bookmarks.py). Optional adversary: forged frames.
 *
 * Every step of the world is one d_step (one transition, no intermediate state stored); the
 * nondeterministic choices (which message, which key, lose or not) are made before it.
 *
 * Seeded bugs (each a -D switch, each refuted by Spin with a trail: tools/model_check.py BUGS,
 * tests/unit/test_model.py):
 *   BUG_TOMB_MAX        a repair's tombstone keeps max(version, position) instead of min
 *   BUG_RELIST_SOME     a history_gone relist relists only the topics asked for (the relist loop)
 *   BUG_PROGRESS_AHEAD  the replay's reader reaches the head before the entries (etcd progress
 *                       notifications sent ahead of their events)
 *   BUG_FEED_DROP       df-feed drops a batch whose publishing failed (issue 45)
 *   BUG_HOLE_DELIVER    an envelope that arrives inside a given-up hole is delivered
 *   BUG_NO_FLOOR        the controller applies an event at or below its topic's position (the
 *                       reference today: docs/model.md "Findings")
 * and two this model cannot refute within CI's bounds (not in the test):
 *   BUG_BOOKMARK_MIDSTREAM a bookmark anchors a stream met mid-stream when its sequence is the
 *                       last applied (the reference until the fleet benchmark found it: a hello
 *                       carries the latest rev with the sequences of the moment); it needs two
 *                       objects in a topic, and the model has one (docs/model.md "Findings")
 *   BUG_BOOKMARK_ANYONE a bookmark of any publisher counts, not only a named feed's (three
 *                       forged frames, and a repair between them)
 */

/* ---------------------------------------------------------------- bounds */
#define NT 2            /* topics; topic t carries one object, key t (so NK = NT) */
#define NK 2
#ifndef MAXW
#define MAXW 4          /* writes to the store */
#endif
#ifndef CH
#define CH 3            /* messages in flight to the subscriber at once (more: dropped, a HWM) */
#endif
#ifndef DUPS
#define DUPS 1          /* duplicates the channel makes */
#endif
#ifndef ADV
#define ADV 0           /* forged frames the adversary sends (0: no adversary) */
#endif
#ifndef HELLOS
#define HELLOS 1        /* idle or welcome hellos sent before quiescence (bookmarks not counted) */
#endif
/* features, each on unless switched off (a configuration of tests/unit/test_model.py):
   NO_DIRECT  NbApi does not publish (df-feed alone)      NO_DEATH    NbApi neither dies nor says bye
   NO_TRIM    the feed is never trimmed                   NO_STOREFAIL the store never fails df-feed
   NO_CKPT    no checkpoint                             NO_COST_RULE the safety rules only (not the
   rule that bookmarks move the position, a cost) */
#define NP 4            /* publisher ids */
#define NB0 0           /* NbApi's publisher, first run */
#define NB1 1           /* NbApi's publisher after its restart (a new id) */
#define FEED 2          /* df-feed, named as a feed (discovery's role = feed) */
#define FORGER 3        /* an id nobody runs: the adversary's */
#define NS 8            /* sequences 1..7 per stream */
#define FAR 7           /* a forged sequence far ahead */
#define J 6             /* max_seq_jump: honest sequences stay at or below 6, so no honest frame
                           is ever J below next (protocol.md §8.6 "Restart") */
#define MAXHELD 2       /* max_held: holding a third envelope on a stream gives up (hold_overflow) */
#define FORGED_V 15     /* a version the store never writes */
#define NONE 255

/* ---------------------------------------------------------------- the store and its feed */
byte head;              /* the store's revision: every write takes the next, and is a feed entry */
byte sver[NK];          /* version of the object (= revision of its last write) */
bool slive[NK];
byte fkey[MAXW + 1];    /* the feed entry at revision r: its object */
bool fdel[MAXW + 1];    /*   and whether it is a delete */
byte ffloor;            /* entries at or below it are trimmed ([feed] max_entries; etcd compaction) */
byte trims;             /* how many times the feed was trimmed (ghost, for the relist-loop check) */
short wlive[NK];        /* ghost: bit v set when the store wrote version v of the object live */

/* ---------------------------------------------------------------- publishers */
byte writes;
byte cur = NB0;         /* NbApi's publisher id */
bool up[NP];            /* the id's process runs */
bool said_bye;          /* NbApi closed (bye) or died once already: it restarted as NB1 */
byte pseq[NP * NT];     /* last sequence assigned per (publisher, topic) */
byte lver[NP * NT * NS];/* what (publisher, topic, seq) carried: version; 0: nothing sent (declared lost) */
bool ldel[NP * NT * NS];
#define LX(p, tq, q) (((p) * NT + (tq)) * NS + (q))

/* df-feed (feed_publisher.py) */
byte rpos;              /* reader.position */
byte fpub;              /* _published */
bool pend;              /* _pending: a batch read and not published */
bool fbm;               /* a bookmark was sent; every later hello carries the latest, fbk */
byte fbk;
bool storefail;         /* the store already failed once under the feed */

/* the channel: a bag of messages (sorted, so that one bag is one state), 0 = free */
int ch[CH];
byte dups;
byte adv;
bool advenv;            /* ghost: an envelope was forged with a running publisher's id */
byte nhello;

/* message = kind (bits 0-1) | publisher (2-3) | event: topic (4), seq (5-7)
 *                                             | hello: q of topic 0 (4-6), topic 1 (7-9), rev + 1 (10-13) */
#define EV 1
#define HELLO 2
#define BYE 3
#define MEV(p, tq, q) (EV | ((p) << 2) | ((tq) << 4) | ((q) << 5))
#define MHELLO(k, p, q0, q1, r1) ((k) | ((p) << 2) | ((q0) << 4) | ((q1) << 7) | ((r1) << 10))
#define KIND(msg) ((msg) & 3)
#define PUB(msg) (((msg) >> 2) & 3)
#define ETOP(msg) (((msg) >> 4) & 1)
#define ESEQ(msg) (((msg) >> 5) & 7)
#define HQ0(msg) (((msg) >> 4) & 7)
#define HQ1(msg) (((msg) >> 7) & 7)
#define HREV1(msg) (((msg) >> 10) & 15)

/* ---------------------------------------------------------------- the subscriber's tracker */
bool known[NP];         /* peers */
bool hseen[NP];         /* hello_topics is set (a complete hello came; both topics are subscribed) */
bool pbye[NP];          /* said_bye */
#define SX(p, tq) ((p) * NT + (tq))
bool sex[NP * NT];      /* the stream exists */
byte snext[NP * NT];
byte shigh[NP * NT];
byte sheld[NP * NT];    /* held envelopes (one event each): bit q = seq q */
bool sgap[NP * NT];     /* deadline set: a gap is open */
byte sdel[NP * NT];     /* ghost: the last sequence delivered on the stream (since it began) */
byte sclaim[NP * NT];   /* claimed_from (0: none) */
byte shf[NP * NT];      /* the given-up hole [hole_from, hole_to] (0, 0: none) */
byte sht[NP * NT];

/* ---------------------------------------------------------------- the controller */
byte cver[NK];          /* version of the object or its tombstone; 0: unknown */
bool clive[NK];
bool touched[NK];       /* VersionedCache.take_touched, and the controller's _touched */
byte pos[NT];           /* positions */
byte proven[NT];        /* _proven */
bool want[NT];          /* a resync is pending for the topic */
bool ckpt;              /* a checkpoint is due */
byte ckpts;
byte relist_trims = NONE; /* ghost: trims when the last history_gone relist ran */
bool clean[NT];         /* ghost: since the last complete repair anchored df-feed's stream of t,
                           nothing of it was lost or given up on */
byte flost[NT];         /* ghost: the highest sequence of df-feed's stream of t no envelope brings
                           (the channel lost it, or df-feed declared it lost) */
#define HOLE(t) (flost[t] != 0 && flost[t] >= snext[SX(FEED, t)])

/* FeedStreams (bookmarks.py): streams of FEED (f = 0) and, seeded bug only, of FORGER (f = 1) */
#define FX(p) ((p) == FORGER)
bool fsfeed[2];         /* _feeds */
bool fsex[2 * NT];
byte fsapp[2 * NT];     /* applied */
byte fsseq[2 * NT];     /* anchor's seq, NONE: none */
bool fsask[2 * NT];
bool fswhole[2 * NT];   /* every sequence from 1 to applied applied in order, none passed over */
#ifdef BUG_BOOKMARK_ANYONE
#define IS_FEED(p) ((p) == FEED || (p) == FORGER)
#else
#define IS_FEED(p) ((p) == FEED)
#endif

/* requests made by one tracker call, handed to the controller after the envelopes released
   with them (they travel in band, behind them: reliability.md "Pacing resyncs") */
hidden byte rqpass[NP * NT];    /* passed over up to (0: nothing) */
hidden byte rqforget[NP];
/* the bookmark a hello passes on (tracker._bookmark): per topic q, NONE: not passed */
hidden byte bmq[NT];
/* the sequences one tracker call delivered, per topic (bit q) */
hidden byte dq[NT];

/* scratch */
hidden byte i, j, k, q, tq, x, y, z, lm, ex, mn, nheld, after, reach, rounds, v;
hidden byte gi, gq, gx, bi, rx, ri, rk;
hidden byte d, b, anyheld, found;
hidden int msg, tmp;
hidden byte lastr[NK];
hidden byte wanted[NK];
hidden byte moved[NT];

/* ================================================================ the channel */
inline sortch() {
  gi = 1;
  do
  :: gi < CH ->
     gx = gi;
     do
     :: gx > 0 && ch[gx - 1] < ch[gx] -> tmp = ch[gx]; ch[gx] = ch[gx - 1]; ch[gx - 1] = tmp; gx--
     :: else -> break
     od;
     gi++
  :: else -> break
  od
}

/* a feed envelope of topic t is gone: no bookmark can be followed over it */
inline lost(mm) {
  if
  :: KIND(mm) == EV && PUB(mm) == FEED ->
     clean[ETOP(mm)] = 0;
     if
     :: ESEQ(mm) > flost[ETOP(mm)] -> flost[ETOP(mm)] = ESEQ(mm)
     :: else -> skip
     fi
  :: else -> skip
  fi
}

inline send(mm) {
  gi = 0;
  do
  :: gi < CH && ch[gi] != 0 -> gi++
  :: else -> break
  od;
  if
  :: gi < CH -> ch[gi] = mm; sortch()
  :: else -> lost(mm)          /* the high-water mark: dropped */
  fi
}

/* ================================================================ the cache (cache.py) */
inline apply(kk, vv, dd, took) {        /* VersionedCache.apply: only a newer version */
  if
  :: vv > cver[kk] -> cver[kk] = vv; clive[kk] = !dd; touched[kk] = 1; took = 1
  :: else -> took = 0
  fi
}

/* ================================================================ FeedStreams (bookmarks.py) */
inline fs_stream(f, tt) {
  if
  :: !fsex[f * NT + tt] ->
     fsex[f * NT + tt] = 1; fsapp[f * NT + tt] = 0; fsseq[f * NT + tt] = NONE;
     fsask[f * NT + tt] = 0; fswhole[f * NT + tt] = 1; fsfeed[f] = 1
  :: else -> skip
  fi
}

inline fs_applied(pp, tt, qq) {         /* FeedStreams.applied(first = last = qq) */
  fs_stream(FX(pp), tt);
  if
  :: qq != fsapp[FX(pp) * NT + tt] + 1 -> fsseq[FX(pp) * NT + tt] = NONE; fswhole[FX(pp) * NT + tt] = 0
  :: else -> skip
  fi;
  fsapp[FX(pp) * NT + tt] = qq
}

inline fs_forget(pp) {                  /* FeedStreams.forget */
  if
  :: pp == FEED || pp == FORGER ->
     fsfeed[FX(pp)] = 0; fsex[FX(pp) * NT] = 0; fsex[FX(pp) * NT + 1] = 0
  :: else -> skip
  fi
}

inline fs_repaired(all, tt) {       /* FeedStreams.repaired: anchor every known feed's stream */
  rx = 0;
  do
  :: rx < 2 ->
     if
     :: fsfeed[rx] ->
        rk = 0;
        do
        :: rk < NT ->
           if
           :: all || rk == tt ->
              fs_stream(rx, rk);
              fsseq[rx * NT + rk] = fsapp[rx * NT + rk];
              fsask[rx * NT + rk] = 0;
              if
              :: rx == 0 -> clean[rk] = 1
              :: else -> skip
              fi
           :: else -> skip
           fi;
           rk++
        :: else -> break
        od
     :: else -> skip
     fi;
     rx++
  :: else -> break
  od
}

/* the requests of one tracker call reach the dispatch thread (runtime.py _on_passed) */
inline flush_requests() {
  rx = 0;
  do
  :: rx < NP ->
     if
     :: rqforget[rx] -> fs_forget(rx); rqforget[rx] = 0
     :: else -> skip
     fi;
     rk = 0;
     do
     :: rk < NT ->
        if
        :: rqpass[SX(rx, rk)] != 0 ->
           if
           :: IS_FEED(rx) ->             /* FeedStreams.passed */
              fs_stream(FX(rx), rk);
              fsseq[FX(rx) * NT + rk] = NONE; fswhole[FX(rx) * NT + rk] = 0;
              if
              :: rqpass[SX(rx, rk)] > fsapp[FX(rx) * NT + rk] -> fsapp[FX(rx) * NT + rk] = rqpass[SX(rx, rk)]
              :: else -> skip
              fi
           :: else -> skip
           fi;
           rqpass[SX(rx, rk)] = 0
        :: else -> skip
        fi;
        rk++
     :: else -> break
     od;
     rx++
  :: else -> break
  od
}

/* tracker._request: the topic is to be repaired; `to` (0: no missing range) is what it passed */
inline request(tt, pp, to, forgotten) {
  want[tt] = 1;
  if
  :: pp == FEED -> clean[tt] = 0
  :: else -> skip
  fi;
  if
  :: forgotten -> rqforget[pp] = 1
  :: !forgotten && to > rqpass[SX(pp, tt)] -> rqpass[SX(pp, tt)] = to
  :: else -> skip
  fi
}

/* ================================================================ delivery to the controller */
/* runtime.py _on_events: apply, note a feed's sequences, vouch */
inline deliver(pp, tt, qq) {
  v = lver[LX(pp, tt, qq)]; d = ldel[LX(pp, tt, qq)];
  /* Rule: the cache never holds a version the store did not write (reliability.md "Truth
     wins"); only a forged frame carries one */
  assert(v == FORGED_V || (d && fkey[v] == tt && fdel[v]) || (!d && (wlive[tt] >> v) & 1));
  /* An event at or below its topic's position is already in the cache, or was overtaken by a
     later write the cache holds (the position means: every write up to it is in the cache): a
     stale event (one stepped down to after the repair that covered it) must not resurrect an
     object the repair left deleted, of which the cache may hold no tombstone */
#ifndef BUG_NO_FLOOR
  if
  :: v <= pos[tt] -> b = 0
  :: else -> apply(tt, v, d, b)
  fi;
#else
  apply(tt, v, d, b);
#endif
  if
  :: IS_FEED(pp) ->
     fs_applied(pp, tt, qq);
     /* cache.vouch: applied, or held at exactly its version (deleted: not held) */
     if
     :: b || (d && !clive[tt]) || (!d && clive[tt] && cver[tt] == v) -> touched[tt] = 0
     :: else -> skip
     fi
  :: else -> skip
  fi
}

inline deliver_all(pp) {
  tq = 0;
  do
  :: tq < NT ->
     gq = 1;
     do
     :: gq < NS ->
        if
        :: (dq[tq] >> gq) & 1 -> deliver(pp, tq, gq)
        :: else -> skip
        fi;
        gq++
     :: else -> break
     od;
     dq[tq] = 0;
     tq++
  :: else -> break
  od
}

/* ================================================================ the tracker (tracker.py) */
/* _append_new (one event per envelope): delivered, i.e. noted in dq and handed to the
   controller at the end of the tracker's call, in sequence order (deliver_all) */
inline append_new(pp, tt, qq) {
  if
  :: qq >= snext[SX(pp, tt)] ->
     /* Rule: delivery is in sequence order per stream, nothing twice (protocol.md §8.3) */
     assert(qq > sdel[SX(pp, tt)]);
     sdel[SX(pp, tt)] = qq;
     dq[tt] = dq[tt] | (1 << qq); snext[SX(pp, tt)] = qq + 1; sclaim[SX(pp, tt)] = 0
  :: else -> skip                       /* a duplicate */
  fi
}

inline reset_stream(sx) {
  sex[sx] = 0; snext[sx] = 0; sdel[sx] = 0; shigh[sx] = 0; sheld[sx] = 0; sgap[sx] = 0; sclaim[sx] = 0;
  shf[sx] = 0; sht[sx] = 0
}

inline new_stream(sx, nx) { reset_stream(sx); sex[sx] = 1; snext[sx] = nx }

/* _give_up: request [next, L], note the hole, deliver what is held, pass the numbers */
inline give_up(pp, tt, forgotten) {
  /* _missing */
  lm = shigh[SX(pp, tt)]; ex = snext[SX(pp, tt)]; gq = 1;
  do
  :: gq < NS ->
     if
     :: (sheld[SX(pp, tt)] >> gq) & 1 ->
        if
        :: gq > ex -> lm = gq - 1
        :: else -> skip
        fi;
        if
        :: gq + 1 > ex -> ex = gq + 1
        :: else -> skip
        fi
     :: else -> skip
     fi;
     gq++
  :: else -> break
  od;
  if
  :: shigh[SX(pp, tt)] >= ex -> lm = shigh[SX(pp, tt)]
  :: else -> skip
  fi;
  if
  :: lm < snext[SX(pp, tt)] -> lm = snext[SX(pp, tt)]
  :: else -> skip
  fi;
  request(tt, pp, lm, forgotten);
  anyheld = (sheld[SX(pp, tt)] != 0);
  mn = 1;
  do
  :: mn < NS && !((sheld[SX(pp, tt)] >> mn) & 1) -> mn++
  :: else -> break
  od;
  if
  :: anyheld && mn > snext[SX(pp, tt)] -> shf[SX(pp, tt)] = snext[SX(pp, tt)]; sht[SX(pp, tt)] = mn - 1
  :: else -> skip
  fi;
  gq = 1;
  do
  :: gq < NS ->
     if
     :: (sheld[SX(pp, tt)] >> gq) & 1 ->
        if
        :: gq > snext[SX(pp, tt)] -> snext[SX(pp, tt)] = gq
        :: else -> skip
        fi;
        append_new(pp, tt, gq)
     :: else -> skip
     fi;
     gq++
  :: else -> break
  od;
  if
  :: !anyheld && shigh[SX(pp, tt)] >= snext[SX(pp, tt)] && sclaim[SX(pp, tt)] == 0 ->
     sclaim[SX(pp, tt)] = snext[SX(pp, tt)]     /* only a hello claimed this run */
  :: else -> skip
  fi;
  sheld[SX(pp, tt)] = 0;
  if
  :: shigh[SX(pp, tt)] + 1 > snext[SX(pp, tt)] -> snext[SX(pp, tt)] = shigh[SX(pp, tt)] + 1
  :: else -> skip
  fi;
  sgap[SX(pp, tt)] = 0
}

inline forget_if_gone(pp) {             /* _forget_if_gone: after a bye, once no gap is open */
  if
  :: known[pp] && pbye[pp] && !sgap[SX(pp, 0)] && !sgap[SX(pp, 1)] ->
     known[pp] = 0; hseen[pp] = 0; pbye[pp] = 0; reset_stream(SX(pp, 0)); reset_stream(SX(pp, 1))
  :: else -> skip
  fi
}

inline forget_publisher(pp) {           /* forget_publisher(reason = publisher_lost) */
  known[pp] = 0; hseen[pp] = 0; pbye[pp] = 0;
  tq = 0;
  do
  :: tq < NT ->
     if
     :: sex[SX(pp, tq)] && (sheld[SX(pp, tq)] != 0 || sgap[SX(pp, tq)]) -> give_up(pp, tq, 1)
     :: sex[SX(pp, tq)] && !(sheld[SX(pp, tq)] != 0 || sgap[SX(pp, tq)]) -> request(tq, pp, 0, 1)
     :: else -> skip
     fi;
     reset_stream(SX(pp, tq));
     tq++
  :: else -> break
  od
}

inline restart(pp, tt, nx) {            /* _restart: a number someone made up moved the stream */
  new_stream(SX(pp, tt), nx);
  request(tt, pp, 0, 0)                 /* seq_jump, no missing range */
}

inline first_contact(pp, tt, nx) {
  new_stream(SX(pp, tt), nx);
  if
  :: nx > 1 -> request(tt, pp, nx - 1, 0)       /* first_seen [1, nx - 1] */
  :: else -> skip
  fi
}

inline hold(pp, tt, qq) {               /* §8.6 Hold */
  if
  :: (sheld[SX(pp, tt)] >> qq) & 1 -> skip      /* the same envelope, held already */
  :: else ->
     sheld[SX(pp, tt)] = sheld[SX(pp, tt)] | (1 << qq);
     if
     :: qq > shigh[SX(pp, tt)] -> shigh[SX(pp, tt)] = qq
     :: else -> skip
     fi;
     sgap[SX(pp, tt)] = 1;
     nheld = 0; gq = 1;
     do
     :: gq < NS -> nheld = nheld + ((sheld[SX(pp, tt)] >> gq) & 1); gq++
     :: else -> break
     od;
     if
     :: nheld > MAXHELD -> give_up(pp, tt, 0)      /* hold_overflow */
     :: else -> skip
     fi
  fi
}

/* SequenceTracker._step_down, §8.6: a frame inside the claimed run; back to the run's start,
   whose numbers below the frame are waited for like any gap; with no gap open, high goes back
   below the run (a number a false claim put there must not make the next hello stale) */
inline step_down(pp, tt) {
  snext[SX(pp, tt)] = sclaim[SX(pp, tt)];
  sclaim[SX(pp, tt)] = 0;
  if
  :: !sgap[SX(pp, tt)] -> shigh[SX(pp, tt)] = snext[SX(pp, tt)] - 1
  :: else -> skip
  fi;
  if                                    /* it may deliver numbers a request passed over: no anchor */
  :: pp == FEED -> clean[tt] = 0
  :: else -> skip
  fi
}

inline on_batch(pp, tt, qq) {           /* SequenceTracker.on_batch, §8.3 */
  known[pp] = 1;
  if
  :: !sex[SX(pp, tt)] && hseen[pp] -> new_stream(SX(pp, tt), 1)
  :: !sex[SX(pp, tt)] && !hseen[pp] -> first_contact(pp, tt, qq)
  :: else -> skip
  fi;
  if
  :: qq < snext[SX(pp, tt)] ->          /* _below */
     if
     :: sclaim[SX(pp, tt)] != 0 && sclaim[SX(pp, tt)] <= qq ->
#ifdef BUG_STEP_DOWN_PASSES
        snext[SX(pp, tt)] = qq          /* to the frame: the run below it passed silently */
#else
        step_down(pp, tt)
#endif
     :: !(sclaim[SX(pp, tt)] != 0 && sclaim[SX(pp, tt)] <= qq) && snext[SX(pp, tt)] - qq > J ->
        restart(pp, tt, qq)
     :: !(sclaim[SX(pp, tt)] != 0 && sclaim[SX(pp, tt)] <= qq) && snext[SX(pp, tt)] - qq <= J && shf[SX(pp, tt)] <= qq && qq <= sht[SX(pp, tt)] ->
        request(tt, pp, qq, 0)          /* late [s, min(l, b)] = [s, s] */
#ifdef BUG_HOLE_DELIVER
        ; snext[SX(pp, tt)] = qq        /* delivered out of order */
#endif
     :: else -> skip
     fi
  :: else -> skip
  fi;
  if
  :: qq > snext[SX(pp, tt)] -> hold(pp, tt, qq)   /* ahead, or inside a claimed run above its start */
  :: else ->
     append_new(pp, tt, qq);
     /* _drain */
     do
     :: sheld[SX(pp, tt)] != 0 ->
        mn = 1;
        do
        :: mn < NS && !((sheld[SX(pp, tt)] >> mn) & 1) -> mn++
        :: else -> break
        od;
        if
        :: mn <= snext[SX(pp, tt)] -> sheld[SX(pp, tt)] = sheld[SX(pp, tt)] & ~(1 << mn); append_new(pp, tt, mn)
        :: else -> break
        fi
     :: else -> break
     od;
     if
     :: sgap[SX(pp, tt)] && sheld[SX(pp, tt)] == 0 && shigh[SX(pp, tt)] < snext[SX(pp, tt)] ->
        sgap[SX(pp, tt)] = 0; forget_if_gone(pp)                 /* filled */
     :: else -> skip
     fi
  fi
}

/* one (T, q) of a hello or bye, §8.4 step 2; prev: hello_topics was set before this hello */
inline hello_topic(pp, tt, qq, prev) {
  if
  :: !sex[SX(pp, tt)] && prev -> new_stream(SX(pp, tt), 1)
  :: else -> skip
  fi;
  if
  :: !sex[SX(pp, tt)] ->
     first_contact(pp, tt, qq + 1);
     if
     :: qq > 0 -> sclaim[SX(pp, tt)] = 1
     :: else -> skip
     fi
  :: else ->
     if
     :: sclaim[SX(pp, tt)] != 0 && sclaim[SX(pp, tt)] <= qq + 1 && qq + 1 < snext[SX(pp, tt)] ->
#ifdef BUG_STEP_DOWN_PASSES
        snext[SX(pp, tt)] = qq + 1;     /* to the frame: the run below it passed silently */
        if
        :: snext[SX(pp, tt)] == sclaim[SX(pp, tt)] -> sclaim[SX(pp, tt)] = 0
        :: else -> skip
        fi
#else
        step_down(pp, tt);
        if
        :: qq >= snext[SX(pp, tt)] ->   /* it sent numbers of the run: lost, or in flight */
           if
           :: qq > shigh[SX(pp, tt)] -> shigh[SX(pp, tt)] = qq
           :: else -> skip
           fi;
           sgap[SX(pp, tt)] = 1
        :: else -> skip
        fi
#endif
     :: else ->
        if
        :: snext[SX(pp, tt)] > qq + 1 && snext[SX(pp, tt)] - (qq + 1) > J ->
           restart(pp, tt, qq + 1);
           if
           :: qq > 0 -> sclaim[SX(pp, tt)] = 1
           :: else -> skip
           fi
        :: else ->
           if
           :: qq >= snext[SX(pp, tt)] && qq > shigh[SX(pp, tt)] ->  /* hello ahead */
              shigh[SX(pp, tt)] = qq; sgap[SX(pp, tt)] = 1
           :: else -> skip                                         /* stale */
           fi
        fi
     fi
  fi
}

/* SequenceTracker.on_hello; q0, q1: the seqs (0: topic not listed); r1: rev + 1 (0: none) */
inline on_hello(pp, kind, q0, q1, r1) {
  known[pp] = 1;
  b = hseen[pp];
  hseen[pp] = 1;                        /* hellos are never split here: every one is complete */
  if
  :: kind == BYE -> pbye[pp] = 1
  :: else -> skip
  fi;
  if
  :: q0 > 0 -> hello_topic(pp, 0, q0, b)
  :: else -> skip
  fi;
  if
  :: q1 > 0 -> hello_topic(pp, 1, q1, b)
  :: else -> skip
  fi;
  /* _bookmark: the topics in agreement with it */
  bmq[0] = NONE; bmq[1] = NONE;
  if
  :: kind == HELLO && r1 > 0 ->
     bi = 0;
     do
     :: bi < NT ->
        if
        :: bi == 0 -> q = q0
        :: else -> q = q1
        fi;
        if
        :: q == 0 && sex[SX(pp, bi)] && snext[SX(pp, bi)] != 1 -> skip
        :: q == 0 && !sex[SX(pp, bi)] -> bmq[bi] = 0
        :: else ->
           if
           :: sex[SX(pp, bi)] && sheld[SX(pp, bi)] == 0 && !sgap[SX(pp, bi)] && sclaim[SX(pp, bi)] == 0 && snext[SX(pp, bi)] - 1 >= q -> bmq[bi] = q
           :: else -> skip
           fi
        fi;
        bi++
     :: else -> break
     od
  :: else -> skip
  fi;
  forget_if_gone(pp)
}

/* ================================================================ bookmarks at the controller */
inline on_bookmark(pp, r1) {            /* runtime.py _on_bookmark, FeedStreams.bookmark */
  if
  :: r1 > 0 && IS_FEED(pp) && (bmq[0] != NONE || bmq[1] != NONE) ->
     bi = 0;
     do
     :: bi < NT ->
        moved[bi] = NONE;
        if
        :: bmq[bi] != NONE ->
           fs_stream(FX(pp), bi);
           x = FX(pp) * NT + bi; q = bmq[bi];
           if
           :: q > fsapp[x] -> fsseq[x] = NONE; fsapp[x] = q; fswhole[x] = 0
           :: else -> skip
           fi;
           if
           :: fsseq[x] != NONE ->     /* the anchor stays: a bookmark's seqs may carry entries above its rev */
              if
              :: fsseq[x] <= q && r1 - 1 > pos[bi] -> moved[bi] = r1 - 1
              :: else -> skip
              fi
           :: else ->
              if
#ifdef BUG_BOOKMARK_MIDSTREAM
              :: q == fsapp[x] && r1 - 1 <= pos[bi] -> fsseq[x] = q; fsask[x] = 0
#else
              :: fswhole[x] && r1 - 1 <= pos[bi] -> fsseq[x] = q; fsask[x] = 0
#endif
              :: else ->
                 if
                 :: !fsask[x] -> fsask[x] = 1; want[bi] = 1       /* replays{reason="anchor"} */
                 :: else -> skip
                 fi
              fi
           fi
        :: else -> skip
        fi;
        bi++
     :: else -> break
     od;
     bi = 0;
     do
     :: bi < NT ->
        if
        :: moved[bi] != NONE -> pos[bi] = moved[bi]
        :: else -> skip
        fi;
        bi++
     :: else -> break
     od
  :: else -> skip
  fi
}

/* ================================================================ repair (runtime.py _repair) */
/* Rule "after a repair the cache equals the store" (reliability.md "Repair by replay": every
   object written or touched since the position equals the store; the rest was equal already) */
inline assert_equal(all, tt) {
  rk = 0;
  do
  :: rk < NK ->
     assert(!(all || rk == tt) || (clive[rk] == slive[rk] && (!slive[rk] || cver[rk] == sver[rk])));
     /* and a forged version lasts only until then, tombstone included (the tombstone keeps
        min(version, position): reliability.md "Truth wins") */
     assert(!(all || rk == tt) || cver[rk] != FORGED_V);
     rk++
  :: else -> break
  od
}

inline relist(all, tt) {                /* relist.py / VersionedCache.reconcile at the head, truth wins */
  printf("STEP   relist (all topics %d, topic %d) at %d\n", all, tt, head);
  k = 0;
  do
  :: k < NK ->
     if
     :: all || k == tt ->
        if
        :: slive[k] -> cver[k] = sver[k]; clive[k] = 1
        :: !slive[k] && clive[k] ->
           clive[k] = 0;
           if                           /* its tombstone keeps at most the listing's revision */
           :: cver[k] > head -> cver[k] = head
           :: else -> skip
           fi
        :: else -> skip
        fi;
        pos[k] = head; want[k] = 0
     :: else -> skip
     fi;
     k++
  :: else -> break
  od;
  if
  :: all -> touched[0] = 0; touched[1] = 0
  :: else -> skip
  fi;
  proven[0] = pos[0]; proven[1] = pos[1];
  fs_repaired(all, tt);
  relist_trims = trims;
  assert_equal(all, tt)
}

/* replay.py replay(), from after = min(positions), every topic covered */
inline replay() {
  printf("STEP   replay from %d reading the entries up to %d\n", after, reach);
  /* the last entry of each object in (after, reach] */
  lastr[0] = 0; lastr[1] = 0;
  x = after + 1;
  do
  :: x <= reach -> lastr[fkey[x]] = x; x++
  :: else -> break
  od;
  k = 0;
  do
  :: k < NK ->
     wanted[k] = 0;
     if
     :: lastr[k] != 0 && fdel[lastr[k]] ->
        if
        :: clive[k] -> clive[k] = 0; cver[k] = lastr[k]     /* deleted from the entry alone */
        :: else -> skip
        fi
     :: lastr[k] != 0 && !fdel[lastr[k]] -> wanted[k] = (!clive[k] || cver[k] != lastr[k])
     :: else -> wanted[k] = touched[k]  /* changed by an event no entry explains */
     fi;
     if
     :: wanted[k] && slive[k] -> cver[k] = sver[k]; clive[k] = 1       /* get_many, correct() */
     :: wanted[k] && !slive[k] && clive[k] ->                          /* gone */
        clive[k] = 0;
#ifdef BUG_TOMB_MAX
        if
        :: head > cver[k] -> cver[k] = head
        :: else -> skip
        fi
#else
        if                              /* min(version, position) */
        :: cver[k] > head -> cver[k] = head
        :: else -> skip
        fi
#endif
     :: else -> skip
     fi;
     touched[k] = 0; want[k] = 0; pos[k] = head;   /* position = the revision the reader reached */
     k++
  :: else -> break
  od;
  ckpt = 0;
  proven[0] = pos[0]; proven[1] = pos[1];
  fs_repaired(1, 0);
  assert_equal(1, 0)
}

/* one repair: the resync scheduler ran (all the topics wanted, coalesced); reach chosen outside */
inline repair() {
  if
  :: ckpt && !want[0] && !want[1] && !touched[0] && !touched[1] && (pos[0] != proven[0] || pos[1] != proven[1]) && pos[0] <= head && pos[1] <= head ->
     proven[0] = pos[0]; proven[1] = pos[1]; ckpt = 0           /* _prove: one read of the head */
  :: else ->
     if
     :: pos[0] > head || pos[1] > head ->       /* AheadOfStore, or _prove refused: _refuse_bookmarks */
        pos[0] = proven[0]; pos[1] = proven[1]
     :: else -> skip
     fi;
     after = (pos[0] < pos[1] -> pos[0] : pos[1]);
     if
     :: after < ffloor ->               /* HistoryGone: relist */
        /* Rule: no livelock of repairs: a relist after history_gone cures it until the feed
           is trimmed again (runtime.py: "or the next repair would ... fail the same way") */
        assert(relist_trims != trims);
#ifdef BUG_RELIST_SOME
        if
        :: want[0] && want[1] -> relist(1, 0)
        :: want[0] && !want[1] -> relist(0, 0)
        :: else -> relist(0, 1)
        fi
#else
        relist(1, 0)
#endif
        ; ckpt = 0
     :: after > head -> relist(1, 0); ckpt = 0  /* ahead of what the store proved: history_rewound */
     :: else -> replay()
     fi
  fi
}

/* ================================================================ writes and publishing */
/* NbApi: commit (a new revision and feed entry), then publish on its own stream */
inline commit(kk, dd) {
  head++;
  fkey[head] = kk; fdel[head] = dd;
  sver[kk] = head; slive[kk] = !dd;
  if
  :: !dd -> wlive[kk] = wlive[kk] | (1 << head)
  :: else -> skip
  fi;
  writes++
}

inline publish(pp, tt, vv, dd) {
  pseq[SX(pp, tt)]++;
  lver[LX(pp, tt, pseq[SX(pp, tt)])] = vv; ldel[LX(pp, tt, pseq[SX(pp, tt)])] = dd;
  send(MEV(pp, tt, pseq[SX(pp, tt)]))
}

/* df-feed's step (feed_publisher.py step/_publish): one message per object of the batch, its
   current version (a delete: the entry's), in feed order */
inline feed_publish(from, to) {
  lastr[0] = 0; lastr[1] = 0;
  y = from + 1;
  do
  :: y <= to -> lastr[fkey[y]] = y; y++
  :: else -> break
  od;
  y = from + 1;
  do
  :: y <= to ->
     if
     :: lastr[fkey[y]] == y && fdel[y] -> publish(FEED, fkey[y], y, 1)
     :: lastr[fkey[y]] == y && !fdel[y] && slive[fkey[y]] -> publish(FEED, fkey[y], sver[fkey[y]], 0)
     :: else -> skip                    /* an older entry of the object, or deleted since */
     fi;
     y++
  :: else -> break
  od
}

inline feed_hello(bookmark) {           /* a hello of df-feed: every one carries the latest bookmark */
  if
  :: bookmark -> fbm = 1; fbk = fpub
  :: else -> skip
  fi;
  y = fbm * (fbk + 1);
  send(MHELLO(HELLO, FEED, pseq[SX(FEED, 0)], pseq[SX(FEED, 1)], y))
}

/* ================================================================ the subscriber takes a message */
inline receive_event(mm) {
  on_batch(PUB(mm), ETOP(mm), ESEQ(mm)); deliver_all(PUB(mm)); flush_requests()
}

inline receive_hello(mm) {
  on_hello(PUB(mm), KIND(mm), HQ0(mm), HQ1(mm), HREV1(mm));
  flush_requests();
  on_bookmark(PUB(mm), HREV1(mm))
}

/* ================================================================ the world */
/* the nondeterministic choices of a step, reset to 0 by the step that takes them (so that they
   are not remembered in the state) */
byte sa, sb, sc;

init {
  d_step {
    up[NB0] = 1; up[FEED] = 1;
    /* the subscriber subscribed, then its first sync listed the empty store: positions 0 */
  }
  do
  /* ---- NbApi writes an object (create, update or delete), then publishes it, or dies first
     (sb = 1: a delete; sc = 1: dies between commit and publish, and restarts as NB1) */
  :: writes < MAXW ->
     if
     :: sa = 0
     :: sa = 1
     fi;
     if
     :: slive[sa] -> sb = 1
     :: skip
     fi;
#ifndef NO_DEATH
     if
     :: !said_bye -> sc = 1
     :: skip
     fi;
#endif
     d_step {
       k = sa; d = sb; z = sc; sa = 0; sb = 0; sc = 0;
       commit(k, d);
#ifdef NO_DIRECT
       z = 1 - z;                         /* no direct publishing: only a death is seen */
       if
       :: z -> skip
       :: else -> up[NB0] = 0; said_bye = 1; cur = NB1; up[NB1] = 1;
          printf("STEP write key %d (delete %d) at revision %d; NbApi dies\n", k, d, head)
       fi;
       z = 0
#else
       if
       :: z -> up[NB0] = 0; said_bye = 1; cur = NB1; up[NB1] = 1;
          printf("STEP write key %d (delete %d) at revision %d; NbApi dies before publishing, restarts as pub 1\n", k, d, head)
       :: else -> publish(cur, k, head, d);
          printf("STEP write key %d (delete %d) at revision %d; pub %d sends seq %d\n", k, d, head, cur, pseq[SX(cur, k)])
       fi
#endif
     }
#ifndef NO_DEATH
#ifndef NO_DIRECT
  :: !said_bye -> d_step {                /* closes cleanly (bye), restarts as NB1 */
       send(MHELLO(BYE, NB0, pseq[SX(NB0, 0)], pseq[SX(NB0, 1)], 0));
       up[NB0] = 0; said_bye = 1; cur = NB1; up[NB1] = 1;
       printf("STEP pub 0 says bye (seqs %d %d), restarts as pub 1\n", pseq[SX(NB0, 0)], pseq[SX(NB0, 1)]) }
#endif
#endif
  :: nhello < HELLOS && pseq[SX(cur, 0)] + pseq[SX(cur, 1)] > 0 -> d_step {   /* an idle or welcome hello */
       nhello++; send(MHELLO(HELLO, cur, pseq[SX(cur, 0)], pseq[SX(cur, 1)], 0));
       printf("STEP pub %d sends a hello (seqs %d %d)\n", cur, pseq[SX(cur, 0)], pseq[SX(cur, 1)]) }

  /* ---- df-feed */
#ifndef NO_FEED
  :: !pend && rpos < ffloor -> d_step {   /* HistoryGone: declare its topics lost, go on from the head */
       rpos = head; fpub = head;
       pseq[SX(FEED, 0)]++; pseq[SX(FEED, 1)]++;                    /* declare_lost */
       clean[0] = 0; clean[1] = 0;
       flost[0] = pseq[SX(FEED, 0)]; flost[1] = pseq[SX(FEED, 1)];  /* numbers no envelope carries */
       feed_hello(0);
       printf("STEP df-feed: history gone, declares its topics lost, goes on from %d\n", head) }
  /* a batch: the entries up to sa; sb = 1: a bookmark after it; sc = 1: the store dies before
     the values are read */
  :: !pend && rpos < head && rpos >= ffloor ->
     select(sa : rpos + 1 .. head);
     if
#ifndef NO_BOOKMARK
     :: sb = 1
#endif
     :: skip
#ifndef NO_STOREFAIL
     :: !storefail -> sc = 1
#endif
     fi;
     d_step {
       z = sa; b = sb; y = sc; sa = 0; sb = 0; sc = 0;
       rpos = z;
       printf("STEP df-feed reads the entries up to %d (store dies before it publishes them %d; bookmark %d)\n", z, y, b);
       if
       :: y ->
          storefail = 1;
#ifdef BUG_FEED_DROP
          fpub = z                        /* the batch is dropped */
#else
          pend = 1                        /* kept: published first at the next step */
#endif
       :: else -> feed_publish(fpub, z); fpub = z; feed_hello(b)
       fi
     }
  :: pend -> d_step { feed_publish(fpub, rpos); fpub = rpos; pend = 0; feed_hello(1);
       printf("STEP df-feed publishes its pending batch up to %d, and a bookmark\n", rpos) }
  :: nhello < HELLOS && (fbm || pseq[SX(FEED, 0)] + pseq[SX(FEED, 1)] > 0) -> d_step { nhello++; feed_hello(0);
       printf("STEP df-feed sends a hello (seqs %d %d, bookmark %d)\n", pseq[SX(FEED, 0)], pseq[SX(FEED, 1)], fbk) }    /* idle */
#endif

  /* ---- the store trims its feed (once) */
#ifndef NO_TRIM
  :: trims == 0 && head > 0 -> d_step { ffloor = head; trims++;
       printf("STEP the store trims its feed up to %d\n", head) }
#endif

  /* ---- the channel delivers any message (reordering: sb = 0), drops one (sb = 1) or
     duplicates one (sb = 2) */
  :: ch[0] != 0 ->
     if
     :: skip
     :: ch[1] != 0 -> sa = 1
#if CH > 2
     :: ch[2] != 0 -> sa = 2
#endif
#if CH > 3
     :: ch[3] != 0 -> sa = 3
#endif
     fi;
     if
     :: skip
     :: sb = 1
     :: dups < DUPS && ch[CH - 1] == 0 -> sb = 2
     fi;
     d_step {
       z = sa; y = sb; sa = 0; sb = 0;
       if
       :: ch[z] == 0 -> skip
       :: ch[z] != 0 && y == 0 && KIND(ch[z]) == EV -> msg = ch[z]; ch[z] = 0; sortch();
          printf("STEP subscriber receives pub %d topic %d seq %d (version %d)\n", PUB(msg), ETOP(msg), ESEQ(msg), lver[LX(PUB(msg), ETOP(msg), ESEQ(msg))]);
          receive_event(msg)
       :: ch[z] != 0 && y == 0 && KIND(ch[z]) != EV -> msg = ch[z]; ch[z] = 0; sortch();
          printf("STEP subscriber receives a hello (bye %d) of pub %d (seqs %d %d, bookmark %d)\n", KIND(msg) == BYE, PUB(msg), HQ0(msg), HQ1(msg), HREV1(msg) - 1);
          receive_hello(msg)
       :: ch[z] != 0 && y == 1 ->
          printf("STEP the channel loses a message of pub %d (kind %d)\n", PUB(ch[z]), KIND(ch[z]));
          lost(ch[z]); ch[z] = 0; sortch()
       :: ch[z] != 0 && y == 2 -> dups++; ch[CH - 1] = ch[z]; sortch();
          printf("STEP the channel duplicates a message of pub %d\n", PUB(ch[z]))
       fi
     }

  /* ---- the subscriber's checks: a gap's window passes; a silent publisher is dead */
  :: sgap[0] || sgap[1] || sgap[2] || sgap[3] || sgap[4] || sgap[5] || sgap[6] || sgap[7] ->
     if
     :: sgap[0] :: sgap[1] -> sa = 1 :: sgap[2] -> sa = 2 :: sgap[3] -> sa = 3
     :: sgap[4] -> sa = 4 :: sgap[5] -> sa = 5 :: sgap[6] -> sa = 6 :: sgap[7] -> sa = 7
     fi;
     d_step { z = sa; sa = 0; printf("STEP the gap of pub %d topic %d expires\n", z / NT, z % NT); give_up(z / NT, z % NT, 0); deliver_all(z / NT); forget_if_gone(z / NT); flush_requests(); z = 0 }
  :: (known[0] && !up[0]) || (known[1] && !up[1]) || (known[2] && !up[2]) || (known[3] && !up[3]) ->
     if
     :: known[0] && !up[0] :: known[1] && !up[1] -> sa = 1
     :: known[2] && !up[2] -> sa = 2 :: known[3] && !up[3] -> sa = 3
     fi;
     d_step { z = sa; sa = 0; printf("STEP pub %d is taken as dead\n", z); forget_publisher(z); deliver_all(z); flush_requests(); z = 0 }

  /* ---- the controller repairs what was asked for, or checkpoints */
  :: want[0] || want[1] || ckpt ->
#ifdef BUG_PROGRESS_AHEAD
     select(sa : 0 .. head);              /* the reader took a progress notification for the head */
     if :: skip fi;
#else
     sa = head;
#endif
     d_step { reach = sa; sa = 0;
       printf("STEP controller repairs (wanted %d %d, checkpoint %d) from positions %d %d, store head %d\n", want[0], want[1], ckpt, pos[0], pos[1], head);
       repair() }
#ifndef NO_CKPT
  :: ckpts == 0 -> d_step { ckpts++; ckpt = 1; printf("STEP a checkpoint is due\n") }
#endif

  /* ---- forged frames: topic sa; sb = 0: an envelope far ahead with NbApi's id and a forged
     version; 1: a hello far ahead with NbApi's id; 2: an envelope of an id nobody runs;
     3: a bookmark (rev sc) of an id not named as a feed */
  :: adv < ADV ->
     if
     :: sa = 0
     :: sa = 1
     fi;
     if
     :: skip
     :: sb = 1
     :: sb = 2
     :: select(sc : 1 .. head + 1); sb = 3
     fi;
     d_step {
       tq = sa; y = sb; z = sc; sa = 0; sb = 0; sc = 0; adv++;
       printf("STEP the adversary forges a frame (kind %d, topic %d, rev %d)\n", y, tq, z);
       if
       :: y == 0 -> lver[LX(cur, tq, FAR)] = FORGED_V; send(MEV(cur, tq, FAR)); advenv = 1
       :: y == 1 -> send(MHELLO(HELLO, cur, (tq == 0) * FAR, (tq == 1) * FAR, 0))
       :: y == 2 ->
          pseq[SX(FORGER, tq)]++; lver[LX(FORGER, tq, pseq[SX(FORGER, tq)])] = FORGED_V;
          send(MEV(FORGER, tq, pseq[SX(FORGER, tq)]))
       :: y == 3 -> send(MHELLO(HELLO, FORGER, pseq[SX(FORGER, 0)], pseq[SX(FORGER, 1)], z + 1))
       fi
     }

  /* ---- quiescence: every write made, nothing in flight, df-feed caught up */
#ifdef NO_FEED
  :: writes == MAXW && ch[0] == 0 -> break
#else
  :: writes == MAXW && ch[0] == 0 && !pend && rpos == head -> break
#endif
  od;
  z = 0;
  /* the channel stops losing: each running publisher's next idle hello arrives */
  d_step {
    printf("STEP quiescence: the idle hellos arrive, silent publishers are dead, gaps expire, repairs run\n");
    msg = MHELLO(HELLO, cur, pseq[SX(cur, 0)], pseq[SX(cur, 1)], 0);
    if
    :: pseq[SX(cur, 0)] + pseq[SX(cur, 1)] > 0 -> receive_hello(msg)
    :: else -> skip
    fi;
    msg = 0
  }
  /* df-feed went quiet: a bookmark at once (feed_publisher.py _bookmark(quiet=True)) */
#ifndef NO_FEED
  d_step {
    fbm = 1; fbk = fpub;
    msg = MHELLO(HELLO, FEED, pseq[SX(FEED, 0)], pseq[SX(FEED, 1)], fbk + 1);
    receive_hello(msg);
    msg = 0;
    /* Rule: a contiguous stream from a feed moves the position (reliability.md "Bookmarks",
       "Moves"): nothing of df-feed's stream lost since a complete repair anchored it */
    /* (a run claimed before that repair, which only an envelope ends, keeps it from agreeing
       with a bookmark: docs/model.md "Findings") */
#ifndef NO_COST_RULE
    /* (nor can a bookmark agree while a number no envelope brings is at or ahead of the stream's
       next: lost before the repair that anchored, or ahead again after a step down; its gap
       expires and asks for the repair that anchors next: docs/model.md "Findings") */
    assert(!clean[0] || sclaim[SX(FEED, 0)] != 0 || HOLE(0) || pos[0] == fpub);
    assert(!clean[1] || sclaim[SX(FEED, 1)] != 0 || HOLE(1) || pos[1] == fpub)
#else
    skip
#endif
  }
#endif
  /* silent publishers are taken as dead */
  d_step {
    x = 0;
    do
    :: x < NP ->
       if
       :: known[x] && !up[x] -> forget_publisher(x); deliver_all(x); flush_requests()
       :: else -> skip
       fi;
       x++
    :: else -> break
    od;
    x = 0
  }
  /* open gaps expire */
  d_step {
    x = 0;
    do
    :: x < NP * NT ->
       if
       :: sgap[x] -> give_up(x / NT, x % NT, 0); deliver_all(x / NT); forget_if_gone(x / NT); flush_requests()
       :: else -> skip
       fi;
       x++
    :: else -> break
    od;
    x = 0
  }
  /* the repairs asked for run; with forged frames, the checkpoint too: a forged version lasts
     until the next repair (reliability.md "Repair by replay", step 3), and nothing else asks
     for one when the forgery opened no gap */
  d_step {
    reach = head;
    rounds = 0;
    do
    :: want[0] || want[1] || ckpt -> repair(); rounds++
    :: else -> break
    od;
    /* Rule: no livelock of repairs once the channel stops losing */
    assert(rounds < 3);
#if ADV > 0
    /* Rule: a forged claim costs a resync, never the real publisher's events (protocol.md §8.6):
       before the checkpoint, what the cache holds differs from the store only by a forged
       version, which nothing but a repair can find. (An envelope forged with a real publisher's
       id can take the place of one of its real envelopes, whose own then is a duplicate: only
       the checkpoint bounds that, security.md; docs/model.md "Findings".) */
    rk = 0;
    do
    :: rk < NK ->
       assert(advenv || cver[rk] == FORGED_V || (clive[rk] == slive[rk] && (!slive[rk] || cver[rk] == sver[rk])));
       rk++
    :: else -> break
    od;
    rounds = 0;
    ckpt = 1;
    do
    :: want[0] || want[1] || ckpt -> repair(); rounds++
    :: else -> break
    od;
    assert(rounds < 3)
#endif
  }
  /* Rule: no committed write is missed silently (reliability.md, protocol.md §8.6): every
     write is in the cache, or a repair covering it was asked for and made it so */
  d_step { assert_equal(1, 0) }
}
