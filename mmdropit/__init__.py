"""mmdropit: train deep networks in less memory under MMEngine."""
