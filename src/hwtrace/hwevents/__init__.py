"""Software events carried by hardware trace channels (PTWRITE, STM/STP,
CoreSight, BTS): their formats, encoders and decoders."""
