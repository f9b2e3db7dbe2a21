// A Java consumer group member for interop tests, run as a single-file program:
//   java -cp "<kafka libs>/*" InteropConsumer.java BOOTSTRAP GROUP TOPIC PROTOCOL [ASSIGNOR]
// PROTOCOL is "classic" or "consumer"; ASSIGNOR (classic only) is "range" or "cooperative-sticky".
// It prints one line per event on stdout:
//   READY
//   ASSIGNED t-0,t-1     REVOKED t-1     LOST t-0
//   OWNED <generation> t-0,t-1    (after a poll, whenever the owned set or generation changed)
//   CLOSED
// and stops (closing the consumer, which leaves the group) when its stdin reaches end of file.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class InteropConsumer {
    static synchronized void emit(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static String names(Collection<TopicPartition> ps) {
        List<String> out = new ArrayList<>();
        for (TopicPartition p : ps) out.add(p.topic() + "-" + p.partition());
        out.sort(null);
        return String.join(",", out);
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], group = args[1], topic = args[2], protocol = args[3];
        String assignor = args.length > 4 ? args[4] : "cooperative-sticky";
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("group.id", group);
        p.put("group.protocol", protocol);
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        p.put("enable.auto.commit", "false");
        p.put("auto.offset.reset", "earliest");
        if (protocol.equals("classic")) {
            p.put("session.timeout.ms", "10000");
            p.put("heartbeat.interval.ms", "500");
            p.put("partition.assignment.strategy", assignor.equals("range")
                ? "org.apache.kafka.clients.consumer.RangeAssignor"
                : "org.apache.kafka.clients.consumer.CooperativeStickyAssignor");
        }
        AtomicBoolean stop = new AtomicBoolean(false);
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            Thread stdin = new Thread(() -> {
                try (BufferedReader r = new BufferedReader(new InputStreamReader(System.in))) {
                    while (r.readLine() != null) { }
                } catch (Exception ignored) { }
                stop.set(true);
                consumer.wakeup();
            });
            stdin.setDaemon(true);
            stdin.start();
            consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> ps) { if (!ps.isEmpty()) emit("REVOKED " + names(ps)); }
                public void onPartitionsAssigned(Collection<TopicPartition> ps) { if (!ps.isEmpty()) emit("ASSIGNED " + names(ps)); }
                public void onPartitionsLost(Collection<TopicPartition> ps) { if (!ps.isEmpty()) emit("LOST " + names(ps)); }
            });
            emit("READY");
            String last = "";
            while (!stop.get()) {
                try {
                    consumer.poll(Duration.ofMillis(200));
                } catch (WakeupException e) {
                    break;
                }
                String now = consumer.groupMetadata().generationId() + " " + names(consumer.assignment());
                if (!now.equals(last)) {
                    emit("OWNED " + now);
                    last = now;
                }
            }
        }
        emit("CLOSED");
    }
}
