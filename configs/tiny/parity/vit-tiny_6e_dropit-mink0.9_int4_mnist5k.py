# The parity suite's vit-tiny with DropIT 0.9 keeping its values in 4 bits and every other saved
# activation it can reach in 4 bits too (the compression issue's accuracy rows). tools/parity.py
# with --gammas 0,0.9: gamma 0 is the exact baseline (both hooks removed), same seeds.
# python tools/parity.py configs/tiny/parity/vit-tiny_6e_dropit-mink0.9_int4_mnist5k.py \
#     --gammas 0,0.9 --seeds 0,1,2,3,4
_base_ = ['./vit-tiny_6e_mnist5k.py']

custom_hooks = [
    dict(type='MemoryReportHook', interval=100),
    dict(type='DropITHook', gamma=0.9, strategy='mink', value_bits=4),
    dict(type='CompressActivationsHook', bits=4),
]
