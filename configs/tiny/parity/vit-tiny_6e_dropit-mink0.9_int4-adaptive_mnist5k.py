# The 4-bit row of the parity suite's tiny ViT with GACT-style adaptive bits: the same bytes of
# codes as 4 bits everywhere (DropIT 0.9's kept values and every other saved activation it can
# reach), each layer given 8, 4 or 2 bits by its measured gradient error on the first batch.
# python tools/parity.py configs/tiny/parity/vit-tiny_6e_dropit-mink0.9_int4-adaptive_mnist5k.py \
#     --gammas 0,0.9 --seeds 0,1,2,3,4
_base_ = ['./vit-tiny_6e_dropit-mink0.9_int4_mnist5k.py']

custom_hooks = [
    dict(type='MemoryReportHook', interval=100),
    dict(type='DropITHook', gamma=0.9, strategy='mink', value_bits=4),
    dict(type='CompressActivationsHook', bits=4, adaptive_bits=True),
]
