/* Compile-time constants of the TNA (Tofino) program. Everything the wire and the controller
 * see (flags, events, drop reasons, sizes of the counters) comes from the v1model program's
 * config.p4, so both programs speak one protocol; this file adds what Tofino decides.
 * docs/tofino.md explains the layout, docs/protocol.md ("Choosing K") the K. */
#ifndef _PASSING_TNA_CONFIG_P4_
#define _PASSING_TNA_CONFIG_P4_

/* K = 64 on Tofino 2: a register action adds a pair of 32-bit values, four actions per stage,
 * so 64 values are 32 pair registers, 8 of its 20 ingress stages, all in one pass (SwitchML
 * also carries 64). The agents speak it as PASSING_K=64. */
#ifndef PASSING_K
#define PASSING_K 64
#endif
#if PASSING_K != 64
#error "the TNA program carries K = 64 values per packet (PASSING_K=64)"
#endif

#include "../include/config.p4"

/* Slots per switch. Version v of slot s is entry s + v * TNA_SLOTS of every slot register (a
 * 16-bit index): 11,264 slots are 22,528 entries, 11 SRAM blocks of 1,024
 * 128-bit words per 64-bit pair register, which leaves every stage room for its tables. */
#define TNA_SLOTS 11264
#define TNA_VERSIONS (2 * TNA_SLOTS)
typedef bit<16> vidx_t;

/* A version's state (register slot_status: count in lo, state in hi). A non-root switch that
 * sent its rack sum up is CLOSED until the spine's result comes back; a root, and a non-root
 * holding the spine's result, is READY. */
const bit<8> ST_OPEN   = 0;
const bit<8> ST_CLOSED = 1;
const bit<8> ST_READY  = 3;

/* Where the packet's round stands against the one its version holds (register slot_round). */
const bit<2> REL_OLDER   = 0;
const bit<2> REL_SAME    = 1;
const bit<2> REL_RESTART = 2;

/* Tofino drops a packet by its deparser's drop_ctl, not by a port. */
const bit<3> DROP_CTL_DROP = 1;

#endif
